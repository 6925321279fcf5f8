package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/ownershiptest"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// The overlap a forward clock step on the Redis host can cause, per mode
// (docs/lock.md, "Clock steps"). A step of S expires early every lock with
// less than S left; its holder, timing on its own monotonic clock, goes on
// trusting its lease. The step is emulated: the lock's PEXPIRE is cut to
// 1 ms behind the holder's back (what a step past its remaining TTL does),
// and a second Locker acquires. The overlap is the time from that second
// acquisition until the first holder's lease ends (Done): while both
// believe they hold the lock.
//
// From the code: a watchdog lease ends at its next renewal, which finds the
// lock gone (renewals every TTL/3), so the overlap is at most TTL/3 (plus a
// round trip); measured at its worst, right after a renewal. An explicit
// lease is never checked: it ends at its trust deadline, so the overlap is
// up to the whole lease (less the TTL/20 margin). Run with -v for the
// figures (go test -v -run TestClockStepOverlap ./internal/ownership/redislock/).
func TestClockStepOverlap(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	env := testenv.Redis(t)
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		lease time.Duration // 0: watchdog
		bound time.Duration // what the code allows
	}{
		{"watchdog", 0, ttl / 3},
		{"explicit lease", ttl, ttl - ownership.SafetyMargin(ttl)},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			key := testenv.UniqueName("step")
			m := ownership.NewMetrics(nil)
			first := newLocker(t, env.URL, redislock.ModeSingle, env.Prefix, ownershiptest.Options{Owner: "first", WatchdogTimeout: ttl, Metrics: m})
			second := newLocker(t, env.URL, redislock.ModeSingle, env.Prefix, ownershiptest.Options{Owner: "second", WatchdogTimeout: ttl, WaitTime: 10 * time.Second})
			held, err := first.Acquire(ctx, key, c.lease)
			require.NoError(t, err)
			if c.lease == 0 {
				// The worst moment: right after a renewal, a whole renewal
				// interval before the next one.
				renewed := func() float64 { return testutil.ToFloat64(m.RenewalsCounter(ownership.RenewalOK)) }
				require.Eventually(t, func() bool { return renewed() >= 1 }, 10*time.Second, time.Millisecond, "no renewal")
			}
			require.NoError(t, env.Client.PExpire(ctx, env.Prefix+":{"+key+"}:lock", time.Millisecond).Err())
			taken, err := second.Acquire(ctx, key, 0)
			require.NoError(t, err)
			both := time.Now()
			select {
			case <-held.Done():
			case <-time.After(c.bound + 5*time.Second):
				t.Fatalf("the first holder still trusts its lease %s after the second acquired", time.Since(both))
			}
			overlap := time.Since(both)
			t.Logf("%s, TTL %s: overlap %s (bound from the code: %s)", c.name, ttl, overlap.Round(time.Millisecond), c.bound)
			// The bound is the behaviour under test, with a loaded
			// machine's margin.
			require.Less(t, overlap, c.bound+time.Second)
			require.NoError(t, taken.Release(ctx))
		})
	}
}
