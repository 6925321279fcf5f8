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

// A fence is max(last fence + 1, Redis TIME in µs) whatever the fence key
// holds: a fence ahead of the clock (a clock stepped back) of the same
// number of digits or more, a short one (the INCR fences of earlier
// versions), and a value that is no number at all (overwritten, as before).
func TestFenceIsMaxOfLastPlusOneAndRedisTime(t *testing.T) {
	t.Parallel()
	srv := startThrowaway(t)
	ctx := context.Background()
	l := newLocker(t, srv.URL(), redislock.ModeSingle, "fm", ownershipOptions("a", 3*time.Second, 3*time.Second))
	admin := srv.Client(t)
	const fenceKey = "fm:{job}:fence"
	acquire := func() int64 {
		t.Helper()
		le, err := l.Acquire(ctx, "job", 0)
		require.NoError(t, err)
		require.NoError(t, le.Release(ctx))
		stored, err := admin.Get(ctx, fenceKey).Int64()
		require.NoError(t, err)
		require.Equal(t, le.Fence(), stored, "the fence key holds the fence handed out")
		return le.Fence()
	}
	nowUS := func() int64 {
		t.Helper()
		now, err := admin.Time(ctx).Result()
		require.NoError(t, err)
		return now.UnixMicro()
	}
	for _, c := range []struct {
		name string
		last int64
	}{
		{"an hour ahead of the clock, same digits", nowUS() + int64(time.Hour/time.Microsecond)},
		{"a digit longer than the clock, above 2^53", 99_999_999_999_999_990},
		{"ending in nines", 1_999_999_999_999_999_999},
		{"all nines: the carry adds a digit", 999_999_999_999_999_999},
		{"2^62", 1 << 62},
	} {
		require.NoError(t, admin.Set(ctx, fenceKey, c.last, 0).Err())
		require.Equal(t, c.last+1, acquire(), c.name)
	}
	for _, c := range []struct{ name, last string }{
		{"a short INCR fence of an earlier version", "42"},
		{"no number", "garbage"},
	} {
		require.NoError(t, admin.Set(ctx, fenceKey, c.last, 0).Err())
		before := nowUS()
		got := acquire()
		require.GreaterOrEqual(t, got, before, c.name+": the fence is Redis TIME")
		require.LessOrEqual(t, got, nowUS(), c.name+": the fence is Redis TIME")
	}
	// Two acquisitions in a row: the second is later, also within one µs.
	a := acquire()
	require.Greater(t, acquire(), a)
}
