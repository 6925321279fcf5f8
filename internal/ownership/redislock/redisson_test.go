package redislock_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// The redisson layout against real Redisson clients (scripts/redisson, one
// JVM per Redisson version and Redis mode): the two exclude each other on
// the same name, and each one's release wakes the other's waiters.

// mixedWorld is one Redis (single or cluster) with a Redisson process on it.
type mixedWorld struct {
	url, mode, prefix string
	admin             redis.UniversalClient
	target            testenv.RedissonTarget
	java              *testenv.Redisson
}

func newMixedWorld(t *testing.T, version, mode string) *mixedWorld {
	t.Helper()
	w := &mixedWorld{mode: mode}
	if mode == redislock.ModeCluster {
		w.url, w.prefix, w.admin = clusterEnv(t)
		w.target = testenv.RedissonTarget{Cluster: testenv.RedisClusterAddrs(t)}
	} else {
		env := testenv.Redis(t)
		w.url, w.prefix, w.admin = env.URL, env.Prefix, env.Client
		w.target = testenv.RedissonTarget{URL: strings.TrimSuffix(env.URL, "/0")}
	}
	// Redisson's default watchdog timeout: a waiter that missed the wake-up
	// would sleep up to 30s.
	w.java = testenv.StartRedisson(t, version, w.target, 30*time.Second)
	return w
}

// locker is a redisson-layout Locker on w's Redis.
func (w *mixedWorld) locker(t *testing.T, owner string, wait time.Duration) *redislock.Locker {
	t.Helper()
	return newLayoutLocker(t, w.url, w.mode, w.prefix, redislock.LayoutRedisson, ownershipOptions(owner, wait, 30*time.Second))
}

// subscribers counts the subscriptions to Redisson's unlock channel of key
// on every master (SUBSCRIBE and SSUBSCRIBE).
func (w *mixedWorld) subscribers(t *testing.T, key string) int64 {
	t.Helper()
	ch := "redisson_lock__channel:{" + key + "}"
	var n atomic.Int64
	count := func(ctx context.Context, c *redis.Client) error {
		m, err := c.PubSubNumSub(ctx, ch).Result()
		if err != nil {
			return err
		}
		s, err := c.PubSubShardNumSub(ctx, ch).Result()
		if err != nil {
			return err
		}
		n.Add(m[ch] + s[ch])
		return nil
	}
	ctx := context.Background()
	if cc, ok := w.admin.(*redis.ClusterClient); ok {
		require.NoError(t, cc.ForEachMaster(ctx, count))
	} else {
		require.NoError(t, count(ctx, w.admin.(*redis.Client)))
	}
	return n.Load()
}

// redissonTries counts, from MONITOR on the master of key, how often a
// Redisson client's lock script ran on key for holder field (its HEXISTS,
// which no coordinator script calls). Redisson's tryLock asks once, then
// subscribes, asks again and sleeps: two tries mean it sleeps. Stopped when
// the test ends.
func (w *mixedWorld) redissonTries(t *testing.T, key, field string) func() int64 {
	t.Helper()
	ctx := context.Background()
	var addr string
	if cc, ok := w.admin.(*redis.ClusterClient); ok {
		n, err := cc.MasterForKey(ctx, key)
		require.NoError(t, err)
		addr = n.Options().Addr
	} else {
		addr = w.admin.(*redis.Client).Options().Addr
	}
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	_, err = conn.Write([]byte("MONITOR\r\n"))
	require.NoError(t, err)
	want := fmt.Sprintf("%q %q %q", "hexists", key, field)
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	// MONITOR's +OK: from here on every command is seen.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	require.True(t, sc.Scan(), "MONITOR: %v", sc.Err())
	require.Equal(t, "+OK", sc.Text())
	require.NoError(t, conn.SetReadDeadline(time.Time{}))
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sc.Scan() {
			if strings.Contains(sc.Text(), want) {
				n.Add(1)
			}
		}
	}()
	t.Cleanup(func() {
		_ = conn.Close()
		<-done
	})
	return n.Load
}

// evalCounter counts the scripts a client runs on one key (its first KEYS
// argument).
type evalCounter struct {
	key string
	n   atomic.Int64
}

func (h *evalCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *evalCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return asProcessHook(h.ProcessPipelineHook, next)
}
func (h *evalCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			args := cmd.Args()
			if len(args) > 3 && (strings.EqualFold(str(args[0]), "evalsha") || strings.EqualFold(str(args[0]), "eval")) && str(args[3]) == h.key {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// countedLocker is w.locker whose scripts on key are counted.
func (w *mixedWorld) countedLocker(t *testing.T, owner, key string, wait time.Duration) (*redislock.Locker, *evalCounter) {
	t.Helper()
	h := &evalCounter{key: key}
	client := w.hookedClient(t, h)
	l, err := redislock.New(client, redislock.Config{Prefix: w.prefix, Owner: owner, WaitTime: wait,
		WatchdogTimeout: 30 * time.Second, Layout: redislock.LayoutRedisson})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close()
	})
	return l, h
}

// hookedClient is a client of w's Redis whose commands h sees. On a cluster
// h sits on the node clients, which every command passes (a script followed
// by WAIT, where the cluster has replicas, goes to its node's client
// directly), and only there, so each command passes h once.
func (w *mixedWorld) hookedClient(t *testing.T, h redis.Hook) redis.UniversalClient {
	t.Helper()
	if w.mode != redislock.ModeCluster {
		c, err := redislock.NewClient(w.url, w.mode)
		require.NoError(t, err)
		c.AddHook(h)
		return c
	}
	o, err := redislock.ParseOptions(w.url, w.mode)
	require.NoError(t, err)
	co := o.Cluster()
	co.NewClient = func(opt *redis.Options) *redis.Client {
		n := redis.NewClient(opt)
		n.AddHook(h)
		return n
	}
	return redis.NewClusterClient(co)
}

func mixedKey(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "mixed/" + name + "/" + hex.EncodeToString(b[:])
}

// oneTry asks l once (its wait budget is a nanosecond) and returns the error.
func oneTry(t *testing.T, l *redislock.Locker, key string) error {
	t.Helper()
	le, err := l.Acquire(context.Background(), key, 0)
	if err == nil {
		require.NoError(t, le.Release(context.Background()))
	}
	return err
}

func TestRedissonInterop(t *testing.T) {
	t.Parallel()
	for _, version := range testenv.RedissonVersions(t) {
		for _, mode := range []string{redislock.ModeSingle, redislock.ModeCluster} {
			t.Run(version+"/"+mode, func(t *testing.T) {
				t.Parallel()
				w := newMixedWorld(t, version, mode)
				t.Run("RedissonUnlockWakesTheWaitingLocker", func(t *testing.T) {
					t.Parallel()
					redissonUnlockWakesTheWaitingLocker(t, w)
				})
				t.Run("LockerReleaseWakesTheWaitingRedisson", func(t *testing.T) {
					t.Parallel()
					lockerReleaseWakesTheWaitingRedisson(t, w)
				})
				t.Run("ReentrantHoldsOnBothSides", func(t *testing.T) {
					t.Parallel()
					reentrantHoldsOnBothSides(t, w)
				})
				t.Run("RedissonLeaseExpires", func(t *testing.T) {
					t.Parallel()
					redissonLeaseExpires(t, w)
				})
				t.Run("KilledRedissonHolder", func(t *testing.T) {
					t.Parallel()
					killedRedissonHolder(t, w, version)
				})
				t.Run("NoOverlapUnderContention", func(t *testing.T) {
					t.Parallel()
					noOverlapUnderContention(t, w)
				})
				t.Run("UnlockBeforeTheWaiterSubscribes", func(t *testing.T) {
					t.Parallel()
					unlockBeforeTheWaiterSubscribes(t, w)
				})
			})
		}
	}
}

func redissonUnlockWakesTheWaitingLocker(t *testing.T, w *mixedWorld) {
	ctx := context.Background()
	key := mixedKey("wake-locker")
	first := w.locker(t, "first", time.Nanosecond)
	lease, err := first.Acquire(ctx, key, 0)
	require.NoError(t, err)
	fence1 := lease.Fence()
	require.NoError(t, lease.Release(ctx))

	require.NoError(t, w.java.Do("h", "lock", key, "0").Err)
	owner := w.java.Do("h", "owner")
	require.NoError(t, owner.Err)
	err = oneTry(t, first, key)
	require.ErrorIs(t, err, ownership.ErrAlreadyOwned, "a Redisson holder excludes the coordinator")
	var ae *ownership.AcquireError
	require.True(t, errors.As(err, &ae))
	require.Equal(t, redislock.RedissonOwnerPrefix+owner.Words[0], ae.Owner, "already_owned names the Redisson client and thread")

	// A waiter that would not ask again for a minute on its own: only the
	// wake-up on Redisson's channel can end its wait in time.
	waiter, asks := w.countedLocker(t, "waiter", key, 40*time.Second)
	redislock.SetPoll(waiter, time.Minute)
	got := make(chan ownership.Lease, 1)
	errs := make(chan error, 1)
	go func() {
		le, err := waiter.Acquire(ctx, key, 0)
		if err != nil {
			errs <- err
			return
		}
		got <- le
	}()
	// Asked, subscribed, asked again (the subscription's confirmation wakes
	// it once): now it sleeps.
	require.Eventually(t, func() bool { return asks.n.Load() >= 2 && w.subscribers(t, key) > 0 }, 20*time.Second, 5*time.Millisecond,
		"the waiting Locker listens on Redisson's unlock channel")
	unlock := w.java.Do("h", "unlock", key)
	require.NoError(t, unlock.Err)
	select {
	case le := <-got:
		t.Logf("Redisson unlock -> Locker acquired: %s", time.Since(unlock.Micros(1)))
		require.Greater(t, le.Fence(), fence1, "fences keep rising across a Redisson holder")
		require.NoError(t, le.Release(ctx))
	case err := <-errs:
		t.Fatalf("the waiting Locker: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("Redisson's unlock did not wake the waiting Locker (it would have waited for its TTL)")
	}
}

func lockerReleaseWakesTheWaitingRedisson(t *testing.T, w *mixedWorld) {
	ctx := context.Background()
	key := mixedKey("wake-redisson")
	holder := w.locker(t, "holder", time.Second)
	lease, err := holder.Acquire(ctx, key, 0)
	require.NoError(t, err)

	// Redisson waits up to 20s; without the wake-up it sleeps for the lock's
	// PTTL (the watchdog's 30s) and gives up at 20s.
	owner := w.java.Do("w", "owner")
	require.NoError(t, owner.Err)
	tries := w.redissonTries(t, key, owner.Words[0])
	tried := w.java.Go("w", "trylock", key, "20000", "0")
	require.Eventually(t, func() bool { return tries() >= 2 && w.subscribers(t, key) > 0 }, 20*time.Second, 5*time.Millisecond,
		"Redisson waits on its unlock channel")
	select {
	case r := <-tried:
		t.Fatalf("Redisson took a lock the coordinator holds: %v %v", r.Words, r.Err)
	default:
	}
	released := time.Now()
	require.NoError(t, lease.Release(ctx))
	select {
	case r := <-tried:
		require.NoError(t, r.Err)
		require.Equal(t, "true", r.Words[0], "Redisson's tryLock gets the lock the coordinator released")
		took := r.Micros(1).Sub(released)
		t.Logf("Locker release -> Redisson acquired: %s", took)
		require.Less(t, took, 10*time.Second, "woken by the release, not by its TTL")
	case <-time.After(30 * time.Second):
		t.Fatal("no answer from Redisson's tryLock")
	}
	require.ErrorIs(t, oneTry(t, holder, key), ownership.ErrAlreadyOwned)
	require.NoError(t, w.java.Do("w", "unlock", key).Err)
}

func reentrantHoldsOnBothSides(t *testing.T, w *mixedWorld) {
	ctx := context.Background()
	key := mixedKey("reentrant")
	l := w.locker(t, "reentrant", time.Nanosecond)
	require.NoError(t, oneTry(t, l, key), "a replica locked the key once (coordinator locks lists such keys)")

	// Redisson holds twice: one unlock leaves it held.
	require.NoError(t, w.java.Do("r", "lock", key, "0").Err)
	require.NoError(t, w.java.Do("r", "lock", key, "0").Err)
	require.Equal(t, []string{"2"}, w.java.Do("r", "holds", key).Words)
	owner := w.java.Do("r", "owner").Words[0]
	require.ErrorIs(t, oneTry(t, l, key), ownership.ErrAlreadyOwned)
	require.NoError(t, w.java.Do("r", "unlock", key).Err)
	require.ErrorIs(t, oneTry(t, l, key), ownership.ErrAlreadyOwned, "one of two Redisson holds released: still held")

	// Locks (coordinator locks) shows the Redisson holder of a key a
	// replica has locked before.
	infos, err := l.Locks(ctx)
	require.NoError(t, err)
	i := slices.IndexFunc(infos, func(i ownership.LockInfo) bool { return i.Key == key })
	require.GreaterOrEqual(t, i, 0, "%v", infos)
	require.Equal(t, redislock.RedissonOwnerPrefix+owner, infos[i].Owner)
	require.Equal(t, int64(1), infos[i].Holds)
	require.Zero(t, infos[i].Fence, "a Redisson holder has no fence")
	require.Positive(t, infos[i].TTL)

	require.NoError(t, w.java.Do("r", "unlock", key).Err)
	lease, err := l.Acquire(ctx, key, 0)
	require.NoError(t, err, "both Redisson holds released")

	// The coordinator holds twice: Redisson is kept out until both go.
	inner, err := l.Acquire(lease.Context(), key, 0)
	require.NoError(t, err)
	require.Equal(t, lease.Fence(), inner.Fence(), "a reentrant hold shares the term's fence")
	require.Equal(t, []string{"false"}, w.java.Do("r", "trylock", key, "0", "0").Words[:1])
	require.NoError(t, inner.Release(ctx))
	require.Equal(t, []string{"false"}, w.java.Do("r", "trylock", key, "0", "0").Words[:1], "one of two holds released: still held")
	infos, err = l.Locks(ctx)
	require.NoError(t, err)
	i = slices.IndexFunc(infos, func(i ownership.LockInfo) bool { return i.Key == key })
	require.GreaterOrEqual(t, i, 0, "%v", infos)
	require.Equal(t, "reentrant", infos[i].Owner)
	require.Equal(t, lease.Fence(), infos[i].Fence)
	require.NoError(t, lease.Release(ctx))
	require.Equal(t, []string{"true"}, w.java.Do("r", "trylock", key, "0", "0").Words[:1])
	require.NoError(t, w.java.Do("r", "unlock", key).Err)
}

func redissonLeaseExpires(t *testing.T, w *mixedWorld) {
	ctx := context.Background()
	key := mixedKey("lease")
	require.NoError(t, w.java.Do("x", "lock", key, "1500").Err, "an explicit Redisson lease of 1.5s")
	l := w.locker(t, "after-lease", 20*time.Second)
	require.ErrorIs(t, oneTry(t, w.locker(t, "probe", time.Nanosecond), key), ownership.ErrAlreadyOwned)
	lease, err := l.Acquire(ctx, key, 0)
	require.NoError(t, err, "the Locker gets the lock once the Redisson lease ends")
	require.NoError(t, lease.Release(ctx))
}

func killedRedissonHolder(t *testing.T, w *mixedWorld, version string) {
	ctx := context.Background()
	key := mixedKey("killed")
	// A JVM of its own, to be killed, with a short watchdog timeout.
	doomed := testenv.StartRedisson(t, version, w.target, 1500*time.Millisecond)
	require.NoError(t, doomed.Do("d", "lock", key, "0").Err)
	probe := w.locker(t, "probe", time.Nanosecond)
	require.ErrorIs(t, oneTry(t, probe, key), ownership.ErrAlreadyOwned)

	l := w.locker(t, "survivor", 30*time.Second)
	got := make(chan error, 1)
	go func() {
		le, err := l.Acquire(ctx, key, 0)
		if err == nil {
			err = le.Release(ctx)
		}
		got <- err
	}()
	require.Eventually(t, func() bool { return w.subscribers(t, key) > 0 }, 20*time.Second, 5*time.Millisecond)
	killed := time.Now()
	doomed.Kill()
	select {
	case err := <-got:
		require.NoError(t, err)
		t.Logf("Redisson holder killed -> Locker acquired: %s (Redisson's watchdog timeout 1.5s)", time.Since(killed))
	case <-time.After(30 * time.Second):
		t.Fatal("the Locker did not get the lock of a killed Redisson holder")
	}
}
