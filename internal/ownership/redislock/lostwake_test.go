package redislock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// A waiting Locker's subscription is gone when the release's wake message
// is published (a reconnect in progress; here its user may no longer
// subscribe, so it cannot come back): the message is lost. The waiter still
// gets the lock, at its next ticket refresh (at most a second), not at the
// end of its wait budget.
func TestLostWakeMessageDelaysTheWaiterOnly(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	ctx := context.Background()
	user, password := testenv.UniqueName("wake"), testenv.UniqueName("pw")
	require.NoError(t, env.Client.Do(ctx, "ACL", "SETUSER", user, "on", ">"+password,
		"~"+env.Prefix+":*", "&"+env.Prefix+":wake:*", "+@all").Err())
	t.Cleanup(func() { env.Client.Do(context.Background(), "ACL", "DELUSER", user) })
	opt, err := redis.ParseURL(env.URL)
	require.NoError(t, err)
	userURL := fmt.Sprintf("redis://%s:%s@%s/%d", user, password, opt.Addr, opt.DB)

	holder := newLocker(t, env.URL, redislock.ModeSingle, env.Prefix, ownershipOptions("holder", time.Second, 30*time.Second))
	waiter := newLocker(t, userURL, redislock.ModeSingle, env.Prefix, ownershipOptions("waiter", 30*time.Second, 30*time.Second))
	held, err := holder.Acquire(ctx, "lostwake", 0)
	require.NoError(t, err)
	wakes := func() int {
		chans, err := env.Client.PubSubChannels(ctx, env.Prefix+":wake:waiter:*").Result()
		require.NoError(t, err)
		return len(chans)
	}
	require.Eventually(t, func() bool { return wakes() == 1 }, 10*time.Second, 10*time.Millisecond, "the waiter subscribed")

	got := acquireAndRelease(ctx, waiter, "lostwake")
	queue := env.Prefix + ":{lostwake}:queue"
	require.Eventually(t, func() bool {
		n, err := env.Client.ZCard(ctx, queue).Result()
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the waiter queued")

	// Redis drops the subscriptions a user may no longer have.
	require.NoError(t, env.Client.Do(ctx, "ACL", "SETUSER", user, "resetchannels").Err())
	require.Eventually(t, func() bool { return wakes() == 0 }, 10*time.Second, 10*time.Millisecond, "the waiter's subscription is gone")

	released := time.Now()
	require.NoError(t, held.Release(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
		t.Logf("the waiter took the lock %s after the release, without its wake message", time.Since(released))
	case <-time.After(10 * time.Second):
		t.Fatal("a lost wake message left the waiter waiting for its whole budget")
	}
	require.Zero(t, wakes(), "the waiter never resubscribed: its wake message was lost")
	require.ErrorIs(t, held.Err(), ownership.ErrReleased)
}
