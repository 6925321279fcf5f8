package billrun_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// pausingLocker hands out its inner Locker's leases only when the test lets
// it: the holder is "paused" between taking the lock and claiming the run
// (a GC pause, SIGSTOP, a failover that loses its lock meanwhile).
type pausingLocker struct {
	ownership.Locker
	acquired chan ownership.Lease
	resume   chan struct{}
}

func (p *pausingLocker) Acquire(ctx context.Context, key string, lease time.Duration) (ownership.Lease, error) {
	le, err := p.Locker.Acquire(ctx, key, lease)
	if err == nil {
		p.acquired <- le
		<-p.resume
	}
	return le, err
}

// A stale holder cannot take a run from a newer one: the claim refuses a
// lock fence below the lock_fence the period's row recorded.
func TestClaimRefusesAnOlderLockFence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 100})
	ctx := context.Background()

	paused := &pausingLocker{Locker: b.locker, acquired: make(chan ownership.Lease, 1), resume: make(chan struct{})}
	staleDone := make(chan *owned.Owned, 1)
	staleRes := make(chan job.Result, 1)
	go func() {
		c, res := b.runnerWith(paused, "", billrun.Config{}).Claim(ctx, period, trig())
		staleDone <- c
		staleRes <- res
	}()
	var stale ownership.Lease
	select {
	case stale = <-paused.acquired:
	case r := <-staleRes:
		t.Fatalf("the stale claim ended before it acquired: %+v", r)
	}
	var resumed sync.Once
	wake := func() { resumed.Do(func() { close(paused.resume) }) }
	t.Cleanup(wake) // a failure below must not leave A paused

	// Meanwhile A's lock was lost (another process's Locker): B takes it,
	// with a higher fence, and claims.
	other := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-b"})
	defer other.Close()
	fresh, res := b.runnerWith(other, "", billrun.Config{}).Claim(ctx, period, trig())
	require.NotNil(t, fresh, res.Error)
	claimed, err := b.runner(billrun.Config{}).Status(ctx, period)
	require.NoError(t, err)
	require.Greater(t, claimed.LockFence, stale.Fence())

	wake() // A wakes and claims with its older lock fence
	staleClaim := <-staleDone
	require.Nil(t, staleClaim, "a claim under an older lock fence took the run from the newer holder")
	// The stale holder lost the run to a newer one: that is the lost
	// outcome (fence_lost, the trigger is redelivered and then finds the
	// run owned or completed), not a failed run of a period that is running.
	lost := <-staleRes
	require.Equal(t, job.OutcomeLost, lost.Outcome, lost.Error)
	require.Contains(t, lost.Error, billrun.ReasonFenceLost)
	require.Contains(t, lost.Error, fmt.Sprint(stale.Fence()), "the error names the refused lock fence")
	require.Contains(t, lost.Error, fmt.Sprint(claimed.LockFence), "and the one the row recorded")
	require.NotContains(t, lost.Error, "<nil>")
	var sawLost bool
	for _, e := range b.rec.Events() {
		require.NotEqual(t, events.RunFailed, e.Type, "run.failed for a period another replica runs")
		if e.Type == events.OwnershipLost && e.Replica == "replica-a" {
			sawLost = true
			require.Equal(t, billrun.ReasonFenceLost, e.Extra["reason"])
		}
	}
	require.True(t, sawLost, "ownership.lost, reason fence_lost")
	st, err := b.runner(billrun.Config{}).Status(ctx, period)
	require.NoError(t, err)
	require.Equal(t, "replica-b", st.Owner)
	require.Equal(t, claimed.LockFence, st.LockFence, "the row still carries the newer holder's lock fence")

	res = fresh.Execute(ctx)
	require.Equal(t, "completed", string(res.Outcome), res.Error)
	b.requireExactlyOnce(t, period)
}
