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

// In the redisson layout the lock is a bare name, and a name may hold a
// hash that is no lock and has no TTL (a Redisson RMap, an application's
// hash). A waiter sees it held by someone else, as it must, and waits
// within its budget; it must not ask Redis every millisecond meanwhile (a
// PTTL of -1 is not "just vanished": it will not go away by itself).
func TestRedissonLayoutWaitForAHashWithoutTTLDoesNotSpin(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	ctx := context.Background()
	key := env.Prefix + ":map"
	require.NoError(t, env.Client.HSet(ctx, key, "some-field", "v").Err())
	client, err := redislock.NewClient(env.URL, redislock.ModeSingle)
	require.NoError(t, err)
	h := &evalCounter{key: key}
	client.AddHook(h)
	l, err := redislock.New(client, redislock.Config{Prefix: env.Prefix, Owner: "w", WaitTime: 1500 * time.Millisecond,
		WatchdogTimeout: 30 * time.Second, Layout: redislock.LayoutRedisson})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close()
	})
	_, err = l.Acquire(ctx, key, 0)
	require.ErrorIs(t, err, ownership.ErrAlreadyOwned)
	// An ask at the start, one after the subscription is confirmed, one
	// per poll (a second): a handful, not one per millisecond.
	require.LessOrEqual(t, h.n.Load(), int64(6), "the waiter asked Redis %d times in 1.5s", h.n.Load())
	v, err := env.Client.HGetAll(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, map[string]string{"some-field": "v"}, v, "the waiter wrote into a hash that is not its lock")
}
