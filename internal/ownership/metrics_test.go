package ownership_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
)

func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := ownership.NewMetrics(reg)
	// A second Metrics on the same registry shares the series.
	m2 := ownership.NewMetrics(reg)
	// A TTL renewed every second: no renewal is late enough to lose the
	// lease on a busy machine (that would change the counts below).
	const ttl = 3 * time.Second
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "a", WaitTime: time.Millisecond, WatchdogTimeout: ttl, Metrics: m})
	defer l.Close()
	ctx := context.Background()

	le, err := l.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	inner, err := l.Acquire(le.Context(), "k", 0)
	require.NoError(t, err)
	_, err = l.Acquire(ctx, "k", 0)
	require.ErrorIs(t, err, ownership.ErrAlreadyOwned)
	m2.Acquire(ownership.OutcomeUnavailable, time.Millisecond)

	require.Equal(t, 1.0, testutil.ToFloat64(m.LeasesHeldGauge()))
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(m.RenewalsCounter(ownership.RenewalOK)) >= 1
	}, 10*ttl, 10*time.Millisecond)
	require.NoError(t, inner.Release(ctx))
	require.NoError(t, le.Release(ctx))

	lost, err := l.Acquire(ctx, "x", 20*time.Millisecond)
	require.NoError(t, err)
	<-lost.Done()

	expected := `
# HELP coordinator_lock_acquisitions_total Lock acquisitions by outcome (acquired, reentered, already_owned, unavailable, canceled).
# TYPE coordinator_lock_acquisitions_total counter
coordinator_lock_acquisitions_total{outcome="acquired"} 2
coordinator_lock_acquisitions_total{outcome="already_owned"} 1
coordinator_lock_acquisitions_total{outcome="canceled"} 0
coordinator_lock_acquisitions_total{outcome="reentered"} 1
coordinator_lock_acquisitions_total{outcome="unavailable"} 1
# HELP coordinator_lock_leases_held Leases currently held by this process.
# TYPE coordinator_lock_leases_held gauge
coordinator_lock_leases_held 0
# HELP coordinator_lock_leases_lost_total Leases that ended without their holder releasing them.
# TYPE coordinator_lock_leases_lost_total counter
coordinator_lock_leases_lost_total 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected),
		"coordinator_lock_acquisitions_total", "coordinator_lock_leases_held", "coordinator_lock_leases_lost_total"))
	n, err := testutil.GatherAndCount(reg, "coordinator_lock_hold_seconds", "coordinator_lock_acquire_wait_seconds")
	require.NoError(t, err)
	require.Equal(t, 2, n)

	// nil Metrics: no-ops.
	var none *ownership.Metrics
	none.Acquire(ownership.OutcomeAcquired, 0)
	none.Held()
	none.Ended(time.Second, true)
	none.Renewals(ownership.RenewalOK, 3)
}
