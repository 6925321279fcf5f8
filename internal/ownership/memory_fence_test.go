package ownership_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// A process restarted in single-replica mode gets a fresh MemoryLocker: its
// fences must still be above the last run's, or Postgres (which refuses a
// lock fence below the one it recorded) would refuse every run after a
// restart.
func TestMemoryFencesRiseAcrossLockers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var last int64
	for range 3 {
		l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "single"})
		le, err := l.Acquire(ctx, "billrun:2026-11", 0)
		require.NoError(t, err)
		require.Greater(t, le.Fence(), last, "a new Locker handed out a fence at or below the previous Locker's")
		last = le.Fence()
		require.NoError(t, le.Release(ctx))
		require.NoError(t, l.Close())
	}
}
