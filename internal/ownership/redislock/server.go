package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// What the Locker needs to know about the Redis it runs on, read with one
// INFO per master (the default sections) and kept for serverRefresh:
//
//   - whether the eviction policy can evict lock keys (maxmemory set and a
//     policy other than noeviction: allkeys-* evicts any key, volatile-*
//     every key with a TTL, and every lock has one). A Locker on such a Redis
//     refuses to lock (ErrUnsafeEviction), because an evicted lock lets a
//     second holder in;
//   - how many replicas are online, for WaitReplicas = auto.

// ErrUnsafeEviction: the Redis the lock runs on may evict lock keys.
var ErrUnsafeEviction = errors.New("redislock: Redis may evict lock keys")

// ErrUnreplicated: fewer replicas than required acknowledged an acquisition
// or a renewal within ReplicaTimeout (Redis WAIT).
var ErrUnreplicated = errors.New("redislock: not acknowledged by the required replicas")

const serverRefresh = 10 * time.Second

type serverState struct {
	mu       sync.Mutex
	at       time.Time      // last successful read; zero: never
	evict    error          // ErrUnsafeEviction (wrapped) or nil
	replicas map[string]int // online replicas by master address
	busy     bool           // a background refresh is running
	warned   bool           // INFO refused: said so once
}

// usable reads the server's state on first use (and refreshes it in the
// background when older than serverRefresh), and fails when the eviction
// policy can evict lock keys.
func (l *Locker) usable(ctx context.Context) error {
	l.srv.mu.Lock()
	at, evict, busy := l.srv.at, l.srv.evict, l.srv.busy
	stale := !at.IsZero() && time.Since(at) > serverRefresh && !busy
	if stale {
		l.srv.busy = true
	}
	l.srv.mu.Unlock()
	if at.IsZero() {
		callCtx, cancel := context.WithTimeout(ctx, DefaultDialTimeout+DefaultReadTimeout)
		defer cancel()
		return l.refreshServer(callCtx)
	}
	if stale {
		l.background(func() {
			ctx, cancel := context.WithTimeout(context.Background(), DefaultDialTimeout+DefaultReadTimeout)
			defer cancel()
			_ = l.refreshServer(ctx)
			l.srv.mu.Lock()
			l.srv.busy = false
			l.srv.mu.Unlock()
		})
	}
	return evict
}

// CheckServer reads the server's state now and returns ErrUnsafeEviction
// (wrapped, naming the server and its settings) when its eviction policy can
// evict lock keys, or the error that kept it from reading. `coordinator`
// calls it at start and refuses to start on ErrUnsafeEviction.
func (l *Locker) CheckServer(ctx context.Context) error {
	return l.refreshServer(ctx)
}

func (l *Locker) refreshServer(ctx context.Context) error {
	type nodeInfo struct {
		addr string
		info string
		err  error
	}
	var mu sync.Mutex
	var nodes []nodeInfo
	read := func(ctx context.Context, c *redis.Client, addr string) error {
		info, err := c.Info(ctx).Result()
		mu.Lock()
		nodes = append(nodes, nodeInfo{addr, info, err})
		mu.Unlock()
		return nil
	}
	var err error
	switch c := l.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return read(ctx, n, n.Options().Addr) })
	case *redis.Client:
		err = read(ctx, c, "")
	default:
		var info string
		info, err = l.client.Info(ctx).Result()
		nodes = append(nodes, nodeInfo{"", info, err})
	}
	if err != nil {
		return err
	}
	replicas := map[string]int{}
	var evict error
	for _, n := range nodes {
		if n.err != nil {
			var rerr redis.Error
			if errors.As(n.err, &rerr) {
				// INFO refused (ACL, renamed command): nothing can be checked.
				l.srv.mu.Lock()
				warn := !l.srv.warned
				l.srv.warned = true
				l.srv.mu.Unlock()
				if warn {
					l.log.Warn("lock_server_unchecked", "error", n.err,
						"detail", "INFO is refused: the eviction policy is not checked and WaitReplicas=auto waits for no replica")
				}
				continue
			}
			return n.err
		}
		f := infoFields(n.info)
		replicas[n.addr] = onlineReplicas(f)
		if err := evictionRisk(f); err != nil && evict == nil {
			where := n.addr
			if where == "" {
				where = "the lock backend"
			}
			evict = fmt.Errorf("%w: %s: %w", ErrUnsafeEviction, where, err)
		}
	}
	l.srv.mu.Lock()
	l.srv.at, l.srv.evict, l.srv.replicas = time.Now(), evict, replicas
	l.srv.mu.Unlock()
	if evict != nil {
		l.log.Error("lock_backend_can_evict_locks", "error", evict)
	}
	return evict
}

func infoFields(info string) map[string]string {
	f := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok {
			f[k] = v
		}
	}
	return f
}

// onlineReplicas counts the slaveN lines in state online.
func onlineReplicas(f map[string]string) int {
	n := 0
	for k, v := range f {
		if strings.HasPrefix(k, "slave") && k != "slave_read_only" && strings.Contains(v, "state=online") {
			n++
		}
	}
	return n
}

// evictionRisk says why a server with these INFO fields can evict lock keys.
func evictionRisk(f map[string]string) error {
	policy := f["maxmemory_policy"]
	maxmem, _ := strconv.ParseInt(f["maxmemory"], 10, 64)
	if policy == "" || policy == "noeviction" || maxmem == 0 {
		return nil
	}
	return fmt.Errorf("maxmemory-policy %s with maxmemory %d evicts keys with a TTL (every lock has one): set maxmemory-policy noeviction, or give the locks a Redis of their own", policy, maxmem)
}

// checkAcked turns WAIT's answer into nil or an ErrUnreplicated error. In
// auto mode a shortfall re-reads the replica count first: after a
// failover the new master has fewer replicas, and what they all
// acknowledged is enough.
func (l *Locker) checkAcked(ctx context.Context, n *redis.Client, addr string, need int, w *redis.Cmd) error {
	got, err := w.Int64()
	if err != nil {
		return fmt.Errorf("%w: WAIT: %w", ErrUnreplicated, err)
	}
	if int(got) >= need {
		return nil
	}
	if l.cfg.WaitReplicas == ReplicasAuto {
		if info, err := n.Info(ctx, "replication").Result(); err == nil {
			now := onlineReplicas(infoFields(info))
			l.srv.mu.Lock()
			if l.srv.replicas == nil {
				l.srv.replicas = map[string]int{}
			}
			l.srv.replicas[addr] = now
			l.srv.mu.Unlock()
			if int(got) >= now {
				return nil
			}
			need = now
		}
	}
	return fmt.Errorf("%w: %d of %d replicas within %s", ErrUnreplicated, got, need, l.cfg.ReplicaTimeout)
}
