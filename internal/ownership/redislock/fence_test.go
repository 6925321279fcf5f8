package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership/redislock"
)

// Fences keep rising when Redis forgets everything: FLUSHALL, and a restart
// without persistence. (A failover to a replica that missed the last
// acquisition is the sentinel test's.)
func TestFencesRiseAcrossFlushAndRestart(t *testing.T) {
	t.Parallel()
	srv := startThrowaway(t)
	ctx := context.Background()
	l := newLocker(t, srv.URL(), redislock.ModeSingle, "fr", ownershipOptions("a", 3*time.Second, 3*time.Second))
	admin := srv.Client(t)
	var last int64
	next := func(what string) {
		t.Helper()
		var le interface {
			Fence() int64
			Release(context.Context) error
		}
		require.Eventually(t, func() bool {
			var err error
			le, err = l.Acquire(ctx, "job", 0)
			return err == nil
		}, 10*time.Second, 20*time.Millisecond, "acquire %s", what)
		require.Greater(t, le.Fence(), last, "fence went back %s", what)
		last = le.Fence()
		require.NoError(t, le.Release(ctx))
	}
	next("at first")
	next("on a second acquisition")
	require.NoError(t, admin.FlushAll(ctx).Err())
	next("after FLUSHALL")
	srv.Stop()
	srv.Start()
	next("after a restart without persistence")
}
