package testenv

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a Redis Cluster of the test's own: throwaway
// redis-servers on free loopback ports (each with its cluster bus on a free
// port of its own, --cluster-port), so that a test may migrate slots, stop
// nodes or stall them without disturbing the shared cluster other tests use.
// The servers are killed when the test ends.
type RedisCluster struct {
	// Masters hold the slots, split evenly in Masters' order; Replicas[i]
	// are the replicas of Masters[i].
	Masters  []*RedisServer
	Replicas [][]*RedisServer
	ids      map[*RedisServer]string
	admins   map[*RedisServer]*redis.Client
}

// StartRedisCluster starts masters masters with replicas replicas each,
// assigns the slots, and waits until every node reports cluster_state:ok,
// every replica is in sync, and every master lists its replicas online.
func StartRedisCluster(t testing.TB, masters, replicas int) *RedisCluster {
	t.Helper()
	if masters < 1 || replicas < 0 {
		t.Fatalf("testenv: cluster of %d masters with %d replicas each", masters, replicas)
	}
	c := &RedisCluster{ids: map[*RedisServer]string{}, admins: map[*RedisServer]*redis.Client{}}
	bus := map[*RedisServer]int{}
	start := func() *RedisServer {
		port := freeLoopbackPort(t)
		s := StartRedisServerWith(t, RedisServerOptions{Args: []string{
			"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(port),
			"--cluster-node-timeout", "5000", "--cluster-require-full-coverage", "yes",
		}})
		bus[s] = port
		return s
	}
	for range masters {
		c.Masters = append(c.Masters, start())
		var rs []*RedisServer
		for range replicas {
			rs = append(rs, start())
		}
		c.Replicas = append(c.Replicas, rs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	all := c.Nodes()
	for _, s := range all {
		c.admins[s] = redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		t.Cleanup(func() { _ = c.admins[s].Close() })
	}
	for _, s := range all {
		id, err := c.admin(t, s).ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatalf("testenv: cluster node %s: %v", s.Addr(), err)
		}
		c.ids[s] = id
	}
	per := 16384 / masters
	for i, m := range c.Masters {
		lo, hi := i*per, (i+1)*per-1
		if i == masters-1 {
			hi = 16383
		}
		if err := c.admin(t, m).Do(ctx, "cluster", "addslotsrange", lo, hi).Err(); err != nil {
			t.Fatalf("testenv: cluster addslotsrange on %s: %v", m.Addr(), err)
		}
	}
	for _, s := range all[1:] {
		// The bus port is not PORT+10000: MEET names it.
		if err := c.admin(t, s).Do(ctx, "cluster", "meet", "127.0.0.1", all[0].Port(), bus[all[0]]).Err(); err != nil {
			t.Fatalf("testenv: cluster meet from %s: %v", s.Addr(), err)
		}
	}
	waitFor(t, time.Minute, "every cluster node knows every other", func(ctx context.Context) bool {
		for _, s := range all {
			if clusterInfo(ctx, c.admin(t, s), "cluster_known_nodes") != strconv.Itoa(len(all)) {
				return false
			}
		}
		return true
	})
	for i, rs := range c.Replicas {
		for _, r := range rs {
			id := c.ids[c.Masters[i]]
			waitFor(t, time.Minute, "replica "+r.Addr()+" becomes a replica of "+c.Masters[i].Addr(), func(ctx context.Context) bool {
				return c.admin(t, r).ClusterReplicate(ctx, id).Err() == nil
			})
		}
	}
	waitFor(t, time.Minute, "cluster_state:ok on every node", func(ctx context.Context) bool {
		for _, s := range all {
			if clusterInfo(ctx, c.admin(t, s), "cluster_state") != "ok" {
				return false
			}
		}
		return true
	})
	for i, m := range c.Masters {
		for _, r := range c.Replicas[i] {
			waitFor(t, time.Minute, "replica "+r.Addr()+" in sync", func(ctx context.Context) bool {
				info, err := c.admin(t, r).Info(ctx, "replication").Result()
				return err == nil && strings.Contains(info, "master_link_status:up")
			})
		}
		if replicas > 0 {
			// A Locker in WaitReplicas auto reads the count from the master.
			waitFor(t, time.Minute, "master "+m.Addr()+" lists its replicas online", func(ctx context.Context) bool {
				info, err := c.admin(t, m).Info(ctx, "replication").Result()
				return err == nil && strings.Count(info, "state=online") == replicas
			})
		}
	}
	return c
}

// Nodes are every server of the cluster, masters first.
func (c *RedisCluster) Nodes() []*RedisServer {
	all := append([]*RedisServer(nil), c.Masters...)
	for _, rs := range c.Replicas {
		all = append(all, rs...)
	}
	return all
}

// Addrs are the masters' addresses (seeds for a cluster client).
func (c *RedisCluster) Addrs() []string {
	var addrs []string
	for _, m := range c.Masters {
		addrs = append(addrs, m.Addr())
	}
	return addrs
}

// URL is the cluster-mode lock URL (redislock.ParseOptions' format: one
// seed in the authority, the others as addr options).
func (c *RedisCluster) URL() string {
	addrs := c.Addrs()
	u := "redis://" + addrs[0]
	if len(addrs) > 1 {
		u += "?addr=" + strings.Join(addrs[1:], "&addr=")
	}
	return u
}

// ID is a node's cluster node id.
func (c *RedisCluster) ID(s *RedisServer) string { return c.ids[s] }

// Client is a cluster client on the cluster, closed when the test ends.
func (c *RedisCluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// MasterOf is the master that owns slot, as its own CLUSTER SHARDS says.
func (c *RedisCluster) MasterOf(t testing.TB, slot int) *RedisServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range c.Masters {
		shards, err := c.admin(t, m).ClusterShards(ctx).Result()
		if err != nil {
			t.Fatalf("testenv: cluster shards on %s: %v", m.Addr(), err)
		}
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if int64(slot) < r.Start || int64(slot) > r.End {
					continue
				}
				for _, n := range sh.Nodes {
					if n.Role == "master" && n.ID == c.ids[m] {
						return m
					}
				}
			}
		}
	}
	t.Fatalf("testenv: no master owns slot %d", slot)
	return nil
}

// Admin is a plain client on one node (no redirects followed), closed
// when the test ends.
func (c *RedisCluster) Admin(t testing.TB, s *RedisServer) *redis.Client { return c.admin(t, s) }

// admin is the node's plain client (made at the start, so that the
// conditions require.Eventually runs in goroutines of its own only read
// the map).
func (c *RedisCluster) admin(t testing.TB, s *RedisServer) *redis.Client {
	cl := c.admins[s]
	if cl == nil {
		t.Fatalf("testenv: %s is not a node of this cluster", s.Addr())
	}
	return cl
}

// clusterInfo reads one field of CLUSTER INFO ("" on error).
func clusterInfo(ctx context.Context, c *redis.Client, field string) string {
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// SlotMigration moves one slot from its master to another by hand, the way
// redis-cli --cluster reshard does, in steps a test can interleave with its
// own: Open (IMPORTING on the target, MIGRATING on the source), Move (MIGRATE
// keys), Close (SETSLOT NODE on the target, the source and the other
// masters).
type SlotMigration struct {
	c              *RedisCluster
	slot           int
	source, target *RedisServer
	src, dst       *redis.Client
	closed         bool
}

// MigrateSlot prepares moving slot from its owner to target.
func (c *RedisCluster) MigrateSlot(t testing.TB, slot int, target *RedisServer) *SlotMigration {
	t.Helper()
	source := c.MasterOf(t, slot)
	if source == target {
		t.Fatalf("testenv: slot %d is already on %s", slot, target.Addr())
	}
	return &SlotMigration{c: c, slot: slot, source: source, target: target, src: c.admin(t, source), dst: c.admin(t, target)}
}

// Source and Target are the slot's master before and after.
func (m *SlotMigration) Source() *RedisServer { return m.source }
func (m *SlotMigration) Target() *RedisServer { return m.target }

// Open marks the slot importing on the target and migrating on the source.
func (m *SlotMigration) Open(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must(t, "setslot importing", m.dst.Do(ctx, "cluster", "setslot", m.slot, "importing", m.c.ids[m.source]).Err())
	must(t, "setslot migrating", m.src.Do(ctx, "cluster", "setslot", m.slot, "migrating", m.c.ids[m.target]).Err())
}

// Keys are the slot's keys still on the source.
func (m *SlotMigration) Keys(t testing.TB) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys, err := m.src.ClusterGetKeysInSlot(ctx, m.slot, 1000).Result()
	must(t, "getkeysinslot", err)
	return keys
}

// Move migrates keys (all of the slot's keys still on the source when none
// are named) to the target with MIGRATE, keeping their TTLs.
func (m *SlotMigration) Move(t testing.TB, keys ...string) {
	t.Helper()
	if len(keys) == 0 {
		keys = m.Keys(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, k := range keys {
		err := m.src.Migrate(ctx, "127.0.0.1", strconv.Itoa(m.target.Port()), k, 0, 5*time.Second).Err()
		if err != nil && err.Error() != "NOKEY" { // gone meanwhile (expired, released)
			must(t, "migrate "+k, err)
		}
	}
}

// Close moves whatever keys are left and assigns the slot to the target on
// the target, the source and every other master (gossip takes it to the
// replicas). Closing again does nothing.
func (m *SlotMigration) Close(t testing.TB) {
	t.Helper()
	if m.closed {
		return
	}
	m.closed = true
	m.Move(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := m.c.ids[m.target]
	must(t, "setslot node on the target", m.dst.Do(ctx, "cluster", "setslot", m.slot, "node", id).Err())
	must(t, "setslot node on the source", m.src.Do(ctx, "cluster", "setslot", m.slot, "node", id).Err())
	for _, o := range m.c.Masters {
		if o != m.source && o != m.target {
			must(t, "setslot node on "+o.Addr(), m.c.admin(t, o).Do(ctx, "cluster", "setslot", m.slot, "node", id).Err())
		}
	}
}

func must(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("testenv: %s: %v", what, err)
	}
}

// Slot is the Redis Cluster hash slot of key (for the test's own checks).
func Slot(t testing.TB, c *redis.Client, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := c.ClusterKeySlot(ctx, key).Result()
	must(t, fmt.Sprintf("cluster keyslot %q", key), err)
	return int(n)
}
