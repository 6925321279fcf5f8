package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/ownershiptest"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// The conformance suite through Sentinel, against a master with a replica:
// every acquisition and renewal also waits for the replica (WAIT, auto).
func TestConformanceSentinel(t *testing.T) {
	t.Parallel()
	env := testenv.RedisSentinel(t)
	ownershiptest.Run(t, backend(env.URL, redislock.ModeSentinel, env.Prefix, env.Client))
}

// newSentinelLocker is a Locker through set's Sentinel with a client of its
// own, both closed when the test ends.
func newSentinelLocker(t *testing.T, set *testenv.RedisSentinelSet, cfg redislock.Config) *redislock.Locker {
	t.Helper()
	client, err := redislock.NewClient(set.URL(), redislock.ModeSentinel)
	require.NoError(t, err)
	cfg.Prefix = "fo"
	l, err := redislock.New(client, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close()
	})
	return l
}

// The master dies; Sentinel promotes the replica. The lock keeps working
// through it: the lease taken before the failover (acknowledged by the
// replica) is still held and renewed, fences go on rising, and the lock
// still excludes.
func TestFailoverKeepsTheLock(t *testing.T) {
	t.Parallel()
	const ttl = 9 * time.Second
	set := testenv.StartRedisSentinelSet(t)
	ctx := context.Background()
	// Every acquisition here needs the replica's acknowledgement, which a
	// busy machine's replica may take longer than the default 200ms to give
	// (make test failed once on it: "0 of 1 replicas within 200ms"): 1.5s,
	// below the 2s read timeout. No WAIT here is meant to fail.
	const replicaTimeout = 1500 * time.Millisecond
	a := newSentinelLocker(t, set, redislock.Config{Owner: "a", WaitTime: 5 * time.Second, WatchdogTimeout: ttl, ReplicaTimeout: replicaTimeout})
	b := newSentinelLocker(t, set, redislock.Config{Owner: "b", WaitTime: 300 * time.Millisecond, WatchdogTimeout: ttl, ReplicaTimeout: replicaTimeout})

	held, err := a.Acquire(ctx, "job", 0)
	require.NoError(t, err)
	replica := set.Replica.Client(t)
	owner, err := replica.HGet(ctx, "fo:{job}:lock", "owner").Result()
	require.NoError(t, err, "Acquire returned before the replica had the lock (no WAIT)")
	require.NotEmpty(t, owner)

	set.Master.Stop()
	set.WaitMaster(t, set.Replica.Addr(), 30*time.Second)

	// A renewal on the new master: its PTTL jumps back up.
	require.Eventually(t, func() bool {
		d, err := replica.PTTL(ctx, "fo:{job}:lock").Result()
		return err == nil && d > ttl-time.Second
	}, 2*ttl, 20*time.Millisecond, "no renewal reached the promoted replica")
	require.NoError(t, held.Err(), "the lease did not survive the failover")
	_, err = b.Acquire(ctx, "job", 0)
	require.ErrorIs(t, err, ownership.ErrAlreadyOwned, "the lock must still exclude after the failover")

	require.NoError(t, held.Release(ctx))
	again, err := b.Acquire(ctx, "job", 0)
	require.NoError(t, err)
	require.Greater(t, again.Fence(), held.Fence(), "fences must rise across the failover")
	require.NoError(t, again.Release(ctx))
}

// A replica that does not acknowledge (paused): an acquisition fails closed
// (unavailable, ErrUnreplicated) and leaves no lock behind; a held watchdog
// lease is lost by its trust deadline, because its renewals are not
// acknowledged either. Once the replica is back, both work again.
func TestUnacknowledgedByTheReplica(t *testing.T) {
	t.Parallel()
	const ttl = 1500 * time.Millisecond
	set := testenv.StartRedisSentinelSet(t)
	ctx := context.Background()
	// The held lease's acquisition needs the replica's acknowledgement,
	// which a busy machine's replica may take longer than the default 200ms
	// to give: 1.5s (below the 2s read timeout). The WAIT that must fail
	// (replica paused) then lasts that long, inside a 10s budget.
	l := newSentinelLocker(t, set, redislock.Config{Owner: "a", WaitTime: 10 * time.Second, WatchdogTimeout: ttl, ReplicaTimeout: 1500 * time.Millisecond})
	master := set.Master.Client(t)

	held, err := l.Acquire(ctx, "held", 0)
	require.NoError(t, err)

	set.Replica.Pause()
	_, err = l.Acquire(ctx, "new", 0)
	require.ErrorIs(t, err, ownership.ErrUnavailable)
	require.ErrorIs(t, err, redislock.ErrUnreplicated)
	require.Eventually(t, func() bool {
		_, err := master.HGet(ctx, "fo:{new}:lock", "owner").Result()
		return err == redis.Nil
	}, 5*time.Second, 10*time.Millisecond, "the unacknowledged lock was left behind")

	select {
	case <-held.Done():
		require.ErrorIs(t, held.Err(), ownership.ErrLeaseLost)
	case <-time.After(3 * ttl):
		t.Fatal("a lease whose renewals no replica acknowledged was trusted past its TTL")
	}

	set.Replica.Resume()
	require.Eventually(t, func() bool {
		le, err := l.Acquire(ctx, "new", 0)
		if err != nil {
			return false
		}
		return le.Release(ctx) == nil
	}, 10*time.Second, 50*time.Millisecond, "acquire once the replica is back")
}
