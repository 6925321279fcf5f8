package redislock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// orderHook runs a client's lock scripts in an order the test chooses:
// before[name] is waited for before a script named name is sent, after[name]
// runs once it has returned (before its caller sees the reply). Each fires
// once.
type orderHook struct {
	mu     sync.Mutex
	before map[string]func()
	after  map[string]func()
}

func (h *orderHook) take(m map[string]func(), name string) func() {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := m[name]
	delete(m, name)
	return f
}

func (h *orderHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *orderHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return asProcessHook(h.ProcessPipelineHook, next)
}
func (h *orderHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var names []string
		for _, cmd := range cmds {
			if name := redislock.ScriptName(cmd); name != "" {
				names = append(names, name)
			}
		}
		for _, name := range names {
			if f := h.take(h.before, name); f != nil {
				f()
			}
		}
		err := next(ctx, cmds)
		for _, name := range names {
			if f := h.take(h.after, name); f != nil {
				f()
			}
		}
		return err
	}
}

// waitOrGiveUp waits for ch, at most 10 s: a hook that orders commands must
// not hang the test when the order it waits for never comes (the test then
// fails on what happened instead).
func waitOrGiveUp(ch <-chan struct{}) {
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
	}
}

// hookedLocker is a Locker of owner "a" whose Redis commands pass through
// an orderHook, so a test can order them.
func hookedLocker(t *testing.T) (*testenv.RedisEnv, *redislock.Locker, *orderHook) {
	t.Helper()
	return hookedLayoutLocker(t, redislock.LayoutCoordinator)
}

// hookedLayoutLocker is hookedLocker in the given layout.
func hookedLayoutLocker(t *testing.T, layout redislock.Layout) (*testenv.RedisEnv, *redislock.Locker, *orderHook) {
	t.Helper()
	env := testenv.Redis(t)
	client, err := redislock.NewClient(env.URL, redislock.ModeSingle)
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	h := &orderHook{before: map[string]func(){}, after: map[string]func(){}}
	client.AddHook(h)
	l, err := redislock.New(client, redislock.Config{Prefix: env.Prefix, Owner: "a", WatchdogTimeout: 30 * time.Second, Layout: layout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return env, l, h
}

// Two goroutines share a lease through its context (a reentrant hold each)
// and give their holds up at the same moment. The last release deletes the
// lock in Redis before the other one's hold-count update arrives there; that
// update then finds no lock. Neither hold was lost: both Releases succeed
// and the lease ends released, not lost.
func TestConcurrentReleasesOfReentrantHolds(t *testing.T) {
	t.Parallel()
	env, l, h := hookedLocker(t)
	ctx := context.Background()

	outer, err := l.Acquire(ctx, "shared", 0)
	require.NoError(t, err)
	inner, err := l.Acquire(outer.Context(), "shared", 0)
	require.NoError(t, err)

	// The inner release's hold-count update reaches Redis only after the
	// outer (last) release ran there, and its answer comes back before the
	// outer release's caller hears of its own.
	releaseRan, innerDone := make(chan struct{}), make(chan struct{})
	h.before["holds"] = func() { waitOrGiveUp(releaseRan) }
	h.after["release"] = func() {
		close(releaseRan)
		select {
		case <-innerDone:
		case <-time.After(10 * time.Second):
		}
	}
	innerErr := make(chan error, 1)
	go func() {
		innerErr <- inner.Release(ctx)
		close(innerDone)
	}()
	// The inner hold is given up first (its count is down to one), then the
	// outer: it is the last.
	require.Eventually(t, func() bool {
		term, _ := ownership.TermOf(outer)
		return term.Holds() == 1
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, outer.Release(ctx))
	require.NoError(t, <-innerErr, "the inner hold was given up, not lost")
	require.ErrorIs(t, outer.Err(), ownership.ErrReleased, "a lease whose holds were all released ended lost")
	_, err = env.Client.HGet(ctx, env.Prefix+":{shared}:lock", "owner").Result()
	require.ErrorIs(t, err, redis.Nil, "the lock is gone")
}

// A goroutine reenters a lease through its context while the owner releases
// the last hold: the release's delete reaches Redis first, and the reentry
// finds no lock. The reentry fails, but the lease ended released, as its
// owner released it: it was not lost.
func TestReentryRacingTheLastRelease(t *testing.T) {
	t.Parallel()
	_, l, h := hookedLocker(t)
	ctx := context.Background()

	outer, err := l.Acquire(ctx, "racing", 0)
	require.NoError(t, err)
	reentering, releaseRan, reentryDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	h.before["holds"] = func() { close(reentering); waitOrGiveUp(releaseRan) }
	h.after["release"] = func() {
		close(releaseRan)
		select {
		case <-reentryDone:
		case <-time.After(10 * time.Second):
		}
	}
	reentryErr := make(chan error, 1)
	go func() {
		_, err := l.Acquire(outer.Context(), "racing", 0)
		reentryErr <- err
		close(reentryDone)
	}()
	select {
	case <-reentering:
	case err := <-reentryErr:
		t.Fatalf("the reentry ended before it reached Redis: %v", err)
	}
	require.NoError(t, outer.Release(ctx))
	require.Error(t, <-reentryErr, "reentered a lease its owner released")
	require.ErrorIs(t, outer.Err(), ownership.ErrReleased, "a lease its owner released ended lost")
}
