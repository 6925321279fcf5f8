package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership/ownershiptest"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// Locks counts the Lockers waiting in a key's queue (the console's
// waiters column, GET /v1/locks).
func TestLocksCountWaiters(t *testing.T) {
	t.Parallel()
	rd := testenv.Redis(t)
	holder := newLocker(t, rd.URL, "single", rd.Prefix, ownershiptest.Options{Owner: "a", WaitTime: 0})
	waiter := newLocker(t, rd.URL, "single", rd.Prefix, ownershiptest.Options{Owner: "b", WaitTime: 20 * time.Second})
	ctx := context.Background()
	held, err := holder.Acquire(ctx, "billrun:2026-04", 0)
	require.NoError(t, err)
	locks, err := holder.Locks(ctx)
	require.NoError(t, err)
	require.Len(t, locks, 1)
	require.Zero(t, locks[0].Waiters)

	got := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "billrun:2026-04", 0)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	require.Eventually(t, func() bool {
		locks, err := holder.Locks(ctx)
		return err == nil && len(locks) == 1 && locks[0].Waiters == 1 && locks[0].Owner == "a"
	}, 15*time.Second, 20*time.Millisecond)
	require.NoError(t, held.Release(ctx))
	require.NoError(t, <-got)
}
