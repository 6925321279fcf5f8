package redislock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/ownershiptest"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// An acquisition answered only after Redis paused writes for longer than
// the lease's trust window (CLIENT PAUSE ... WRITE, on a throwaway server)
// is given back and asked again within the wait budget: the caller gets a
// lease it can trust, not one that is already lost (issue 24).
func TestAcquisitionAnsweredTooLateIsRetried(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	srv := testenv.StartRedisServer(t)
	admin := srv.Client(t)
	ctx := context.Background()
	holder := newLocker(t, srv.URL(), redislock.ModeSingle, "late", ownershiptest.Options{Owner: "a", WatchdogTimeout: ttl})
	held, err := holder.Acquire(ctx, "k", 0)
	require.NoError(t, err)

	waiter := newLocker(t, srv.URL(), redislock.ModeSingle, "late", ownershiptest.Options{Owner: "b", WatchdogTimeout: ttl, WaitTime: 20 * time.Second})
	require.NoError(t, admin.Do(ctx, "client", "pause", "2500", "write").Err())
	le, err := waiter.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	require.NoError(t, le.Err(), "the lease is usable, not lost on arrival")
	deadline, ok := waiter.TrustDeadline(le)
	require.True(t, ok)
	require.True(t, time.Now().Before(deadline), "trusted for a while yet")
	require.Greater(t, le.Fence(), held.Fence())
	require.NoError(t, le.Release(ctx))
}

// lateReply holds back the reply of the first acquisition that succeeds,
// for delay: as if Redis had answered that late.
type lateReply struct {
	delay time.Duration
	done  atomic.Bool
}

func (h *lateReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *lateReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if redislock.ScriptName(cmd) == "acquire" && err == nil {
			if _, fence := cmd.(*redis.Cmd).Val().(string); fence && h.done.CompareAndSwap(false, true) {
				time.Sleep(h.delay)
			}
		}
		return err
	}
}

// An acquisition answered too late, with no wait budget left to ask again:
// unavailable (ErrAcquiredTooLate, exit 69 for coordinator lock), not
// already owned, and the acquisition is given back, not left for its TTL.
// MinTrust counts too: answered with less than MinTrust of trust left is
// too late.
func TestAcquisitionAnsweredTooLateAtTheEndOfTheWait(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	ctx := context.Background()
	for _, c := range []struct {
		name     string
		minTrust time.Duration
		delay    time.Duration
	}{
		{"past the trust deadline", 0, 1200 * time.Millisecond},
		{"within MinTrust of it", 700 * time.Millisecond, 400 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			client, err := redislock.NewClient(env.URL, redislock.ModeSingle)
			require.NoError(t, err)
			t.Cleanup(func() { _ = client.Close() })
			client.AddHook(&lateReply{delay: c.delay})
			l, err := redislock.New(client, redislock.Config{Prefix: env.Prefix, Owner: "slow", WatchdogTimeout: time.Second,
				WaitTime: 100 * time.Millisecond, MinTrust: c.minTrust})
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close() })
			key := testenv.UniqueName("late")
			_, err = l.Acquire(ctx, key, 0)
			require.ErrorIs(t, err, ownership.ErrUnavailable)
			require.ErrorIs(t, err, redislock.ErrAcquiredTooLate)
			n, err := env.Client.Exists(ctx, env.Prefix+":{"+key+"}:lock").Result()
			require.NoError(t, err)
			require.Zero(t, n, "the late acquisition was given back")
		})
	}
}

func TestMinTrustLongerThanTheLeaseIsRefused(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	client, err := redislock.NewClient(env.URL, redislock.ModeSingle)
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	l, err := redislock.New(client, redislock.Config{Prefix: env.Prefix, Owner: "x", MinTrust: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	_, err = l.Acquire(context.Background(), "k", 2*time.Second)
	require.ErrorIs(t, err, ownership.ErrInvalidKey)
}
