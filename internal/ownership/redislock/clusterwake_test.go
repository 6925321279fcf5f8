package redislock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership/redislock"
)

// In a cluster the release runs on the master of the key's slot, and the
// waiting Locker's subscription may be on any node: the wake message is
// published cluster-wide, on that Locker's channel only, and the waiter
// takes the lock. (The conformance suite's wake tests cannot tell a wake
// message from the waiter's one-second ticket refresh.)
func TestClusterReleaseWakesTheWaitingLocker(t *testing.T) {
	t.Parallel()
	url, prefix, admin := clusterEnv(t)
	ctx := context.Background()
	ps := admin.PSubscribe(ctx, prefix+":wake:*")
	t.Cleanup(func() { _ = ps.Close() })
	_, err := ps.Receive(ctx)
	require.NoError(t, err)
	msgs := ps.Channel()

	holder := newLocker(t, url, redislock.ModeCluster, prefix, ownershipOptions("holder", time.Second, 30*time.Second))
	waiter := newLocker(t, url, redislock.ModeCluster, prefix, ownershipOptions("waiter", 30*time.Second, 30*time.Second))
	// Keys on different slots (and so, likely, masters).
	for _, key := range []string{"w1", "w2", "w3", "w4"} {
		held, err := holder.Acquire(ctx, key, 0)
		require.NoError(t, err)
		got := acquireAndRelease(ctx, waiter, key)
		require.Eventually(t, func() bool {
			n, err := admin.ZCard(ctx, prefix+":{"+key+"}:queue").Result()
			return err == nil && n == 1
		}, 10*time.Second, 10*time.Millisecond, "the waiter queued for %s", key)
		require.NoError(t, held.Release(ctx))
		select {
		case m := <-msgs:
			require.True(t, strings.HasPrefix(m.Channel, prefix+":wake:waiter:"), "woke %s", m.Channel)
			require.Equal(t, key, m.Payload)
		case <-time.After(10 * time.Second):
			t.Fatalf("no wake message for %s", key)
		}
		require.NoError(t, <-got)
	}
}
