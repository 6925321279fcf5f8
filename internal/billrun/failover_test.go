package billrun_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func sentinelLocker(t *testing.T, set *testenv.RedisSentinelSet, owner string, replicas int) *redislock.Locker {
	t.Helper()
	client, err := redislock.NewClient(set.URL(), redislock.ModeSentinel)
	require.NoError(t, err)
	l, err := redislock.New(client, redislock.Config{Prefix: "fo", Owner: owner, WaitReplicas: replicas})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close()
	})
	return l
}

// A failover loses the lock: replica A's lock was written to the master only
// (replication was cut, and A did not wait for replicas), the master
// dies, Sentinel promotes the replica, and B takes the lock there with a
// higher fence and claims the run. A, paused between taking its lock and
// claiming, then claims with its older fence: Postgres refuses it, and B's
// run completes exactly once.
func TestFailoverLosingTheLockCannotLetTheStaleHolderClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 100})
	ctx := context.Background()
	set := testenv.StartRedisSentinelSet(t)
	lockA := sentinelLocker(t, set, "replica-a", redislock.ReplicasNone)
	lockB := sentinelLocker(t, set, "replica-b", redislock.ReplicasAuto)

	set.CutReplication(t)
	paused := &pausingLocker{Locker: lockA, acquired: make(chan ownership.Lease, 1), resume: make(chan struct{})}
	staleDone := make(chan *owned.Owned, 1)
	go func() {
		c, _ := b.runnerWith(paused, "", billrun.Config{}).Claim(ctx, period, trig())
		staleDone <- c
	}()
	var stale ownership.Lease
	select {
	case stale = <-paused.acquired:
	case <-time.After(10 * time.Second):
		t.Fatal("replica A never took the lock")
	}

	set.Master.Stop()
	set.Replica.Resume()
	set.WaitMaster(t, set.Replica.Addr(), 30*time.Second)

	var fresh *owned.Owned
	require.Eventually(t, func() bool {
		c, _ := b.runnerWith(lockB, "", billrun.Config{}).Claim(ctx, period, trig())
		fresh = c
		return c != nil
	}, 20*time.Second, 100*time.Millisecond, "replica B could not take the lost lock on the promoted replica")
	claimed, err := b.runner(billrun.Config{}).Status(ctx, period)
	require.NoError(t, err)
	require.Greater(t, claimed.LockFence, stale.Fence(), "the fence must rise across the failover")
	require.NoError(t, stale.Err(), "A still believes it holds the lock (its next renewal is seconds away)")

	close(paused.resume)
	require.Nil(t, <-staleDone, "the stale holder's claim took the run")
	st, err := b.runner(billrun.Config{}).Status(ctx, period)
	require.NoError(t, err)
	require.Equal(t, "replica-b", st.Owner)
	require.Equal(t, claimed.LockFence, st.LockFence)

	res := fresh.Execute(ctx)
	require.Equal(t, "completed", string(res.Outcome), res.Error)
	b.requireExactlyOnce(t, period)
}
