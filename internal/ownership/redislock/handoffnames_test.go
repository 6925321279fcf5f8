package redislock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// The scripts derive the waiting Locker's id from its token (up to the
// last ':') and the wake channel's prefix and the key from the lock key's
// name. With ':' in the replica id, the prefix and the key, the hand-off
// still reserves the lock for the waiter's own id, wakes it on exactly the
// channel it subscribed to, with the key as the message, and the waiter
// takes the lock.
func TestHandOffNamesWithColons(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	ctx := context.Background()
	prefix := env.Prefix + ":a:b"
	const key = "billrun:2026-11/x.y_z"
	ps := env.Client.PSubscribe(ctx, prefix+":wake:*")
	t.Cleanup(func() { _ = ps.Close() })
	_, err := ps.Receive(ctx)
	require.NoError(t, err)
	msgs := ps.Channel()

	holder := newLocker(t, env.URL, redislock.ModeSingle, prefix, ownershipOptions("pod:holder:1", time.Second, 30*time.Second))
	waiter := newLocker(t, env.URL, redislock.ModeSingle, prefix, ownershipOptions("pod:waiter:2", 30*time.Second, 30*time.Second))
	var channel string // the waiter's wake channel, as it subscribed
	require.Eventually(t, func() bool {
		chans, err := env.Client.PubSubChannels(ctx, prefix+":wake:pod:waiter:2:*").Result()
		if err != nil || len(chans) != 1 {
			return false
		}
		channel = chans[0]
		return true
	}, 10*time.Second, 10*time.Millisecond, "the waiter subscribed")
	id := strings.TrimPrefix(channel, prefix+":wake:")

	held, err := holder.Acquire(ctx, key, 0)
	require.NoError(t, err)
	got := acquireAndRelease(ctx, waiter, key)
	queue := prefix + ":{" + key + "}:queue"
	require.Eventually(t, func() bool {
		n, err := env.Client.ZCard(ctx, queue).Result()
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the waiter queued")
	members, err := env.Client.ZRange(ctx, queue, 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{id}, members, "the queue entry is the waiter's Locker id")

	require.NoError(t, held.Release(ctx))
	select {
	case m := <-msgs:
		require.Equal(t, channel, m.Channel, "the hand-off woke another channel")
		require.Equal(t, key, m.Payload)
	case <-time.After(10 * time.Second):
		t.Fatal("no wake message")
	}
	require.NoError(t, <-got)
}
