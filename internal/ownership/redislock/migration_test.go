package redislock_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// A held key's slot migrates to another master (CLUSTER SETSLOT
// IMPORTING/MIGRATING, MIGRATE of its keys one by one, SETSLOT NODE), on a
// cluster of the test's own, with and without replicas:
//   - renewals follow ASK (the lock key moved, the slot not yet) and MOVED
//     (the slot moved, the client's map not yet), WAIT included where
//     replicas must acknowledge, and the holder never loses its lease (nor
//     does `coordinator lock`'s probe, LockTTL, lose the lock);
//   - the multi-key acquire and release scripts get TRYAGAIN while the slot
//     is split between the two masters; they retry within their budget, so
//     a release issued mid-migration ends the term once the migration is
//     over, and the waiter queued on that key, and a fresh acquirer of
//     another key of the slot, acquire then.
func TestClusterSlotMigrationWithReplicas(t *testing.T)    { testSlotMigration(t, 1) }
func TestClusterSlotMigrationWithoutReplicas(t *testing.T) { testSlotMigration(t, 0) }

func testSlotMigration(t *testing.T, replicas int) {
	t.Parallel()
	const ttl = 3 * time.Second
	c := testenv.StartRedisCluster(t, 2, replicas)
	ctx := context.Background()
	const prefix = "mig"
	// Three keys of one slot: released mid-migration (a waiter queued on
	// it), acquired fresh mid-migration, and held across the whole move.
	released := "released"
	slot := redislock.SlotOf(prefix + ":{" + released + "}:lock")
	fresh, held := sameSlotKey(prefix, "fresh", slot), sameSlotKey(prefix, "held", slot)
	lockKey := func(k string) string { return prefix + ":{" + k + "}:lock" }

	tries := &tryAgainHook{key: released}
	newLocker := func(owner string, wait time.Duration) *redislock.Locker {
		client := clusterClient(t, c.URL(), tries)
		l, err := redislock.New(client, redislock.Config{Prefix: prefix, Owner: owner, WaitTime: wait, WatchdogTimeout: ttl,
			ReplicaTimeout: time.Second})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	holder := newLocker("holder", 10*time.Second)
	le, err := holder.Acquire(ctx, released, 0)
	require.NoError(t, err)
	heldLe, err := holder.Acquire(ctx, held, 0)
	require.NoError(t, err)

	waiter := newLocker("waiter", time.Minute)
	waited := acquireAsync(ctx, waiter, released, 0)
	source := c.MasterOf(t, slot)
	require.Eventually(t, func() bool {
		n, err := c.Admin(t, source).ZCard(ctx, prefix+":{"+released+"}:queue").Result()
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the waiter queued")

	var target *testenv.RedisServer
	for _, m := range c.Masters {
		if m != source {
			target = m
		}
	}
	m := c.MigrateSlot(t, slot, target)
	m.Open(t)
	// The lock keys first: their renewals now get ASK from the source.
	m.Move(t, lockKey(released), lockKey(held))
	renewedOn(t, c.Admin(t, target), lockKey(held), ttl)
	renewedOn(t, c.Admin(t, target), lockKey(released), ttl)
	// `coordinator lock`'s probe finds the moved lock too.
	left, ok, err := holder.LockTTL(ctx, held, heldLe.Fence())
	require.NoError(t, err)
	require.True(t, ok, "the probe lost the moved lock")
	require.Positive(t, left)
	m.Move(t) // the fence keys, the queue, its tickets
	renewedOn(t, c.Admin(t, target), lockKey(held), ttl)

	// Mid-migration: a fresh acquisition of another key of the slot, and the
	// release of the key the waiter waits for. Both get TRYAGAIN until the
	// slot is whole again, and neither may give up.
	freshLocker := newLocker("fresh", time.Minute)
	freshGot := acquireAsync(ctx, freshLocker, fresh, 10*time.Second)
	releasedErr := make(chan error, 1)
	go func() { releasedErr <- le.Release(ctx) }()
	require.Eventually(t, tries.seen, 20*time.Second, 5*time.Millisecond, "the release was tried mid-migration")
	select {
	case err := <-releasedErr:
		t.Fatalf("the release returned mid-migration: %v", err)
	case r := <-waited:
		t.Fatalf("the waiter returned mid-migration: %v", r.err)
	case r := <-freshGot:
		t.Fatalf("the fresh acquisition returned mid-migration: %v", r.err)
	default:
	}
	require.NoError(t, heldLe.Err(), "the lease held across the move")

	m.Close(t)
	select {
	case err := <-releasedErr:
		require.NoError(t, err, "the release issued mid-migration")
	case <-time.After(20 * time.Second):
		t.Fatal("the release did not end after the migration")
	}
	for name, ch := range map[string]<-chan acquired{"the waiter": waited, "the fresh acquirer": freshGot} {
		select {
		case r := <-ch:
			require.NoError(t, r.err, name)
			require.NoError(t, r.le.Release(ctx), name)
		case <-time.After(20 * time.Second):
			t.Fatalf("%s did not acquire after the migration", name)
		}
	}
	// The slot is the target's now; the holder's client may still map it to
	// the source (MOVED).
	renewedOn(t, c.Admin(t, target), lockKey(held), ttl)
	require.NoError(t, heldLe.Err(), "the lease held across the move")
	require.NoError(t, heldLe.Release(ctx))
	n, err := c.Admin(t, target).Exists(ctx, lockKey(held), lockKey(released), lockKey(fresh)).Result()
	require.NoError(t, err)
	require.Zero(t, n, "locks left behind")
}

type acquired struct {
	le  ownership.Lease
	err error
}

func acquireAsync(ctx context.Context, l *redislock.Locker, key string, lease time.Duration) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		le, err := l.Acquire(ctx, key, lease)
		ch <- acquired{le, err}
	}()
	return ch
}

// sameSlotKey is a lock key name base-N whose lock key hashes to slot.
func sameSlotKey(prefix, base string, slot int) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("%s-%d", base, i)
		if redislock.SlotOf(prefix+":{"+k+"}:lock") == slot {
			return k
		}
	}
}

// renewedOn waits until key, on node (a master importing its slot or owning
// it), has run down below 80% of ttl and then been renewed above 90%.
func renewedOn(t *testing.T, node *redis.Client, key string, ttl time.Duration) {
	t.Helper()
	pttl := func() time.Duration {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		pipe := node.Pipeline()
		pipe.Do(ctx, "asking")
		d := pipe.PTTL(ctx, key)
		_, _ = pipe.Exec(ctx)
		return d.Val()
	}
	require.Eventually(t, func() bool { d := pttl(); return d > 0 && d < ttl*8/10 }, 20*time.Second, 5*time.Millisecond, "%s runs down on %s", key, node.Options().Addr)
	require.Eventually(t, func() bool { return pttl() > ttl*9/10 }, 20*time.Second, 5*time.Millisecond, "%s renewed on %s", key, node.Options().Addr)
}

// clusterClient is a lock client on the cluster URL whose node clients
// carry hook h.
func clusterClient(t *testing.T, url string, h redis.Hook) *redis.ClusterClient {
	t.Helper()
	o, err := redislock.ParseOptions(url, redislock.ModeCluster)
	require.NoError(t, err)
	co := o.Cluster()
	co.NewClient = func(opt *redis.Options) *redis.Client {
		n := redis.NewClient(opt)
		n.AddHook(h)
		return n
	}
	client := redis.NewClusterClient(co)
	client.AddHook(h)
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// tryAgainHook notices a release script of key answered TRYAGAIN.
type tryAgainHook struct {
	key  string
	mu   sync.Mutex
	done bool
}

func (h *tryAgainHook) seen() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done
}

func (h *tryAgainHook) note(cmds []redis.Cmder) {
	for _, cmd := range cmds {
		if redislock.ScriptName(cmd) != "release" || !redis.HasErrorPrefix(cmd.Err(), "TRYAGAIN") {
			continue
		}
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.Contains(s, "{"+h.key+"}") {
				h.mu.Lock()
				h.done = true
				h.mu.Unlock()
			}
		}
	}
}

func (h *tryAgainHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *tryAgainHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.note([]redis.Cmder{cmd})
		return err
	}
}
func (h *tryAgainHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.note(cmds)
		return err
	}
}

// On the master a slot is migrating away from, a script runs only while all
// its keys are there, and fails half-way on any command on a key that is
// not: one it deleted itself or a zset its ZREM emptied. The contended
// paths that run there (the acquire that takes a reservation, the leave
// that passes one on) must not do either.
func TestScriptsOnAMigratingSource(t *testing.T) {
	t.Parallel()
	c := testenv.StartRedisCluster(t, 2, 0)
	ctx := context.Background()
	const prefix = "src"
	newLocker := func(owner string) *redislock.Locker {
		client := clusterClient(t, c.URL(), nopHook{})
		l, err := redislock.New(client, redislock.Config{Prefix: prefix, Owner: owner, WaitTime: 10 * time.Second})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	// reserve writes key's lock as a reservation for ids[0] with the queue
	// and tickets of ids, all on the slot's master, then opens the slot's
	// migration with nothing moved yet.
	reserve := func(t *testing.T, key string, ids ...string) (*testenv.SlotMigration, *redis.Client) {
		tag := prefix + ":{" + key + "}"
		slot := redislock.SlotOf(tag + ":lock")
		source := c.MasterOf(t, slot)
		admin := c.Admin(t, source)
		now := time.Now()
		require.NoError(t, admin.HSet(ctx, tag+":lock", "reserved", ids[0]).Err())
		require.NoError(t, admin.PExpire(ctx, tag+":lock", time.Minute).Err())
		require.NoError(t, admin.Set(ctx, tag+":fence", "1", 0).Err())
		for i, id := range ids {
			require.NoError(t, admin.ZAdd(ctx, tag+":queue", redis.Z{Score: float64(now.UnixMicro() + int64(i)), Member: id}).Err())
			require.NoError(t, admin.ZAdd(ctx, tag+":tickets", redis.Z{Score: float64(now.Add(time.Minute).UnixMilli()), Member: id}).Err())
		}
		var target *testenv.RedisServer
		for _, m := range c.Masters {
			if m != source {
				target = m
			}
		}
		m := c.MigrateSlot(t, slot, target)
		m.Open(t)
		t.Cleanup(func() { m.Close(t) })
		return m, admin
	}

	t.Run("AcquireTakesItsReservation", func(t *testing.T) {
		l := newLocker("taker")
		m, admin := reserve(t, "take", redislock.ID(l))
		le, err := l.Acquire(ctx, "take", 0)
		require.NoError(t, err)
		owner, err := admin.HGet(ctx, prefix+":{take}:lock", "owner").Result()
		require.NoError(t, err, "the lock is on the source, held")
		require.True(t, strings.HasPrefix(owner, redislock.ID(l)+":"), owner)
		m.Close(t) // the release's ended marker would split the slot's keys
		require.NoError(t, le.Release(ctx))
	})
	t.Run("LeavePassesTheReservationOn", func(t *testing.T) {
		l := newLocker("leaver")
		_, admin := reserve(t, "leave", redislock.ID(l), "next")
		next, err := redislock.Leave(ctx, l, "leave")
		require.NoError(t, err)
		require.Equal(t, "next", next)
		reserved, err := admin.HGet(ctx, prefix+":{leave}:lock", "reserved").Result()
		require.NoError(t, err)
		require.Equal(t, "next", reserved)
		queued, err := admin.ZRange(ctx, prefix+":{leave}:queue", 0, -1).Result()
		require.NoError(t, err)
		require.Equal(t, []string{"next"}, queued)
	})
}

type nopHook struct{}

func (nopHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (nopHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (nopHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
