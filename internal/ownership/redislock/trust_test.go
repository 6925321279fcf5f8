package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// TrustDeadline is the acquisition's trust deadline at first, moves with
// each renewal that counted, and is gone once the lease ends.
func TestTrustDeadlineFollowsRenewals(t *testing.T) {
	t.Parallel()
	const ttl = 1500 * time.Millisecond
	env := testenv.Redis(t)
	ctx := context.Background()
	l := newLocker(t, env.URL, redislock.ModeSingle, env.Prefix, ownershipOptions("a", time.Second, ttl))
	sent := time.Now()
	le, err := l.Acquire(ctx, "trust", 0)
	require.NoError(t, err)
	first, ok := l.TrustDeadline(le)
	require.True(t, ok)
	require.False(t, first.Before(ownership.TrustDeadline(sent, ttl)), "earlier than the acquire's own deadline")
	require.False(t, first.After(ownership.TrustDeadline(time.Now(), ttl)), "later than the acquire's own deadline")
	require.Eventually(t, func() bool {
		d, ok := l.TrustDeadline(le)
		return ok && d.After(first)
	}, 10*time.Second, 10*time.Millisecond, "a renewal did not move the trust deadline")
	require.NoError(t, le.Release(ctx))
	_, ok = l.TrustDeadline(le)
	require.False(t, ok, "a released lease has no trust deadline")
}
