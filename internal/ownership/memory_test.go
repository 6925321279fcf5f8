package ownership_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/ownershiptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func memoryBackend() ownershiptest.Backend {
	return ownershiptest.Backend{
		New: func(t *testing.T, o ownershiptest.Options) ownership.Locker {
			return ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: o.Owner, WaitTime: o.WaitTime, WatchdogTimeout: o.WatchdogTimeout})
		},
		DeleteLock: func(t *testing.T, l ownership.Locker, key string) {
			l.(*ownership.MemoryLocker).DeleteLock(key)
		},
		NewUnreachable: func(t *testing.T, o ownershiptest.Options) ownership.Locker {
			l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: o.Owner, WaitTime: o.WaitTime, WatchdogTimeout: o.WatchdogTimeout})
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
// deadline, not before and not much later.
func TestMemoryUnreachableWhileHeldLosesAtTrustDeadline(t *testing.T) {
	t.Parallel()
	const ttl = 600 * time.Millisecond
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "a", WatchdogTimeout: ttl})
	defer l.Close()
	ctx := context.Background()
	le, err := l.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	l.SetUnavailable(true)
	start := time.Now()
	select {
	case <-le.Done():
	case <-time.After(2 * ttl):
		t.Fatal("lease not lost while the backend was unreachable")
	}
	require.ErrorIs(t, le.Err(), ownership.ErrLeaseLost)
	require.Less(t, time.Since(start), ttl, "lost after the TTL could have run out")
}

func TestMemoryOwnerRequired(t *testing.T) {
	t.Parallel()
	require.Panics(t, func() { ownership.NewMemoryLocker(ownership.MemoryConfig{}) })
}
