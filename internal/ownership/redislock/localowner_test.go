package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// gatedAcquire holds back the reply of the first acquisition that succeeds
// until gate is closed.
type gatedAcquire struct {
	gate    chan struct{}
	reached chan struct{}
	held    bool
}

func (h *gatedAcquire) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *gatedAcquire) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *gatedAcquire) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if redislock.ScriptName(cmd) == "acquire" && err == nil && !h.held {
			if _, fence := cmd.(*redis.Cmd).Val().(string); fence {
				h.held = true
				close(h.reached)
				<-h.gate
			}
		}
		return err
	}
}

// Two callers of one Locker ask for a key at once (the demo's cron tick and
// HTTP call on one replica). The first takes the lock while the second
// waits behind it in the process; the second, never the head while the
// lock was free, does not ask Redis and times out. Its already_owned must
// name the owner, which is known: this Locker's own term holds the lock.
// (TestDemoShowsOneRunAndWhoOwnsIt failed under load with "already_owned
// events name no owner"; the other case here named the previous holder.)
func TestALocalWaiterNamesTheLocalOwner(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	ctx := context.Background()
	newGated := func(t *testing.T, owner string) (*redislock.Locker, *gatedAcquire) {
		client, err := redislock.NewClient(env.URL, redislock.ModeSingle)
		require.NoError(t, err)
		t.Cleanup(func() { _ = client.Close() })
		h := &gatedAcquire{gate: make(chan struct{}), reached: make(chan struct{})}
		client.AddHook(h)
		l, err := redislock.New(client, redislock.Config{Prefix: env.Prefix, Owner: owner, WatchdogTimeout: 10 * time.Second, WaitTime: 2 * time.Second})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		return l, h
	}
	waitBehind := func(t *testing.T, l *redislock.Locker, h *gatedAcquire, key string, first <-chan error) {
		t.Helper()
		second := make(chan error, 1)
		go func() { _, err := l.Acquire(ctx, key, 0); second <- err }()
		require.Eventually(t, func() bool { return redislock.LocalWaiters(l, key) == 2 }, 10*time.Second, time.Millisecond)
		close(h.gate)
		require.NoError(t, <-first)
		err := <-second
		var ae *ownership.AcquireError
		require.True(t, errors.As(err, &ae), "%v", err)
		require.ErrorIs(t, err, ownership.ErrAlreadyOwned)
		require.Equal(t, "r1", ae.Owner, "already_owned names the owner: this replica")
	}

	t.Run("the lock was free", func(t *testing.T) {
		t.Parallel()
		l, h := newGated(t, "r1")
		key := testenv.UniqueName("local")
		first := make(chan error, 1)
		go func() { _, err := l.Acquire(ctx, key, 0); first <- err }()
		<-h.reached
		waitBehind(t, l, h, key, first)
	})
	// The head's ask is still in flight when the second caller's wait runs
	// out (a loaded machine: the demo's waits are 500ms). Nothing of this
	// process has been answered yet, so nobody knows whether the lock is
	// even held: the second caller asks Redis itself before it answers.
	t.Run("the head's ask was still in flight", func(t *testing.T) {
		t.Parallel()
		l, h := newGated(t, "r1")
		key := testenv.UniqueName("local")
		first := make(chan error, 1)
		go func() { _, err := l.Acquire(ctx, key, 0); first <- err }()
		<-h.reached
		_, err := l.Acquire(ctx, key, 0)
		close(h.gate)
		require.NoError(t, <-first)
		var ae *ownership.AcquireError
		require.True(t, errors.As(err, &ae), "%v", err)
		require.ErrorIs(t, err, ownership.ErrAlreadyOwned)
		require.Equal(t, "r1", ae.Owner, "already_owned names the owner: this replica")
	})
	t.Run("another replica held it", func(t *testing.T) {
		t.Parallel()
		other, oh := newGated(t, "r0")
		close(oh.gate)
		key := testenv.UniqueName("local")
		held, err := other.Acquire(ctx, key, 0)
		require.NoError(t, err)
		l, h := newGated(t, "r1")
		first := make(chan error, 1)
		go func() { _, err := l.Acquire(ctx, key, 0); first <- err }()
		queue := env.Prefix + ":{" + key + "}:queue"
		require.Eventually(t, func() bool {
			n, err := env.Client.ZCard(ctx, queue).Result()
			return err == nil && n == 1
		}, 10*time.Second, time.Millisecond, "r1 queued behind r0")
		require.NoError(t, held.Release(ctx))
		<-h.reached
		waitBehind(t, l, h, key, first)
	})
}
