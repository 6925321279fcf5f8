package ownership_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/ownershiptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func memoryBackend() ownershiptest.Backend {
	return ownershiptest.Backend{
		New: func(t *testing.T, o ownershiptest.Options) ownership.Locker {
			return ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: o.Owner, WaitTime: o.WaitTime, WatchdogTimeout: o.WatchdogTimeout, Metrics: o.Metrics})
		},
		DeleteLock: func(t *testing.T, l ownership.Locker, key string) {
			l.(*ownership.MemoryLocker).DeleteLock(key)
		},
		NewUnreachable: func(t *testing.T, o ownershiptest.Options) ownership.Locker {
			l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: o.Owner, WaitTime: o.WaitTime, WatchdogTimeout: o.WatchdogTimeout, Metrics: o.Metrics})
			l.SetUnavailable(true)
			return l
		},
	}
}

func TestMemoryConformance(t *testing.T) {
	t.Parallel()
	ownershiptest.Run(t, memoryBackend())
}

// Renewals that cannot reach the backend lose a watchdog lease at its trust
// deadline: not before (the lock may still be ours), and not long after.
func TestMemoryUnreachableWhileHeldLosesAtTrustDeadline(t *testing.T) {
	t.Parallel()
	// A 3s TTL: the first renewal is due 1s after the acquisition, long
	// after the backend goes away, so the trust deadline is the
	// acquisition's own.
	const ttl = 3 * time.Second
	m := ownership.NewMetrics(nil)
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "a", WatchdogTimeout: ttl, Metrics: m})
	defer l.Close()
	ctx := context.Background()
	sent := time.Now()
	le, err := l.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	l.SetUnavailable(true)
	select {
	case <-le.Done():
	case <-time.After(ttl + 5*time.Second):
		t.Fatal("lease not lost while the backend was unreachable")
	}
	lostAfter := time.Since(sent)
	require.ErrorIs(t, le.Err(), ownership.ErrLeaseLost)
	require.Zero(t, testutil.ToFloat64(m.RenewalsCounter(ownership.RenewalOK)), "a renewal got through before the backend went away")
	require.GreaterOrEqual(t, lostAfter, ttl-ownership.SafetyMargin(ttl), "lost before the trust deadline")
	require.Less(t, lostAfter, ttl+2*time.Second, "kept trusting the lease long past the TTL")
}

func TestMemoryOwnerRequired(t *testing.T) {
	t.Parallel()
	require.Panics(t, func() { ownership.NewMemoryLocker(ownership.MemoryConfig{}) })
}
