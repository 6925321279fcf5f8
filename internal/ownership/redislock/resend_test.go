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

// resendHook sends the next command that runs a named lock script twice, as
// go-redis does when the first send's reply does not come within the read
// timeout: the first send runs in Redis and its reply is thrown away, then
// between runs (what other clients did meanwhile), then the resend runs and
// its reply is the one the Locker sees. retry_test.go stalls Redis so that
// nothing can happen between the two; here something does.
type resendHook struct {
	mu      sync.Mutex
	script  string
	between func()
	first   any // the first send's reply, for the test to look at
}

func (h *resendHook) arm(script string, between func()) {
	h.mu.Lock()
	h.script, h.between = script, between
	h.mu.Unlock()
}

func (h *resendHook) take(cmd redis.Cmder) func() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.script == "" || redislock.ScriptName(cmd) != h.script {
		return nil
	}
	f := h.between
	h.script, h.between = "", nil
	return f
}

func (h *resendHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *resendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return asProcessHook(h.ProcessPipelineHook, next)
}

// ProcessPipelineHook sends the pipeline with the armed script twice, as
// go-redis resends a whole pipeline.
func (h *resendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var between func()
		var cmd redis.Cmder
		for _, c := range cmds {
			if between = h.take(c); between != nil {
				cmd = c
				break
			}
		}
		if between == nil {
			return next(ctx, cmds)
		}
		_ = next(ctx, cmds)
		if cmd.Err() == nil {
			h.mu.Lock()
			h.first, _ = cmd.(*redis.Cmd).Result()
			h.mu.Unlock()
		}
		between()
		return next(ctx, cmds)
	}
}

type resendWorld struct {
	env     *testenv.RedisEnv
	hook    *resendHook
	a, b    *redislock.Locker // a's scripts are resent; b contends
	key     string
	lockKey string
}

func resendSetup(t *testing.T, layout redislock.Layout, name string) *resendWorld {
	t.Helper()
	env := testenv.Redis(t)
	client, err := redislock.NewClient(env.URL, redislock.ModeSingle)
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	key := keyIn(layout, env.Prefix, name)
	w := &resendWorld{env: env, hook: &resendHook{}, key: key, lockKey: lockKeyIn(layout, env.Prefix, key)}
	// Each script is one EVALSHA (no NOSCRIPT round), so the resent
	// command is the one that runs.
	require.NoError(t, redislock.LoadScripts(context.Background(), env.Client))
	client.AddHook(w.hook)
	w.a, err = redislock.New(client, redislock.Config{Prefix: env.Prefix, Owner: "a", WatchdogTimeout: 30 * time.Second, Layout: layout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.a.Close() })
	w.b = newLayoutLocker(t, env.URL, redislock.ModeSingle, env.Prefix, layout, ownershipOptions("b", 10*time.Second, 30*time.Second))
	return w
}

func (w *resendWorld) field(t *testing.T, name string) string {
	t.Helper()
	v, err := w.env.Client.HGet(context.Background(), w.lockKey, name).Result()
	require.NoError(t, err, "the lock's %s", name)
	return v
}

// count is the lock's holds or seq as its holder has it: the field, or
// absent (no reentry yet, see scripts.go) 1 hold and seq 0. The lock
// itself must exist.
func (w *resendWorld) count(t *testing.T, name string) string {
	t.Helper()
	vals, err := w.env.Client.HMGet(context.Background(), w.lockKey, "owner", name).Result()
	require.NoError(t, err)
	require.NotNil(t, vals[0], "the lock is not held")
	if vals[1] == nil {
		return map[string]string{"holds": "1", "seq": "0"}[name]
	}
	return vals[1].(string)
}

// Resends that arrive after the lock changed hands: the resend of a's
// script must leave b's lock exactly as b has it, and tell a the truth.
func TestResentScriptsAfterATakeover(t *testing.T) {
	t.Parallel()
	forLayouts(t, resentScriptsAfterATakeover)
}

func resentScriptsAfterATakeover(t *testing.T, layout redislock.Layout) {
	ctx := context.Background()

	// The release ran, and b took the lock before the resend came: the
	// resend finds b's lock, must not touch it, and must still answer
	// "released" (a's release did succeed).
	t.Run("Release", func(t *testing.T) {
		t.Parallel()
		w := resendSetup(t, layout, "release")
		le, err := w.a.Acquire(ctx, w.key, 0)
		require.NoError(t, err)
		var taken ownership.Lease
		w.hook.arm("release", func() {
			taken, err = w.b.Acquire(ctx, w.key, 0)
			require.NoError(t, err, "b takes the released lock")
		})
		require.NoError(t, le.Release(ctx), "a resent release that succeeded the first time must not report not held")
		require.ErrorIs(t, le.Err(), ownership.ErrReleased)
		require.Greater(t, taken.Fence(), le.Fence())
		require.Equal(t, "b", w.field(t, "replica"), "the resend touched b's lock")
		require.Equal(t, itoa(taken.Fence()), w.field(t, "fence"))
		require.NoError(t, taken.Err())
		require.NoError(t, taken.Release(ctx), "b still holds its lock")
	})

	// An inner (not last) release updated the hold count; before the
	// resend the lock was deleted behind a's back and b took it. The resend
	// must not write a's count into b's lock; a learns it lost the lock.
	t.Run("HoldsAfterTheLockWasDeleted", func(t *testing.T) {
		t.Parallel()
		w := resendSetup(t, layout, "holds")
		outer, err := w.a.Acquire(ctx, w.key, 0)
		require.NoError(t, err)
		inner, err := w.a.Acquire(outer.Context(), w.key, 0)
		require.NoError(t, err)
		var taken ownership.Lease
		w.hook.arm("holds", func() {
			require.NoError(t, w.env.Client.Del(ctx, w.lockKey).Err())
			taken, err = w.b.Acquire(ctx, w.key, 0)
			require.NoError(t, err)
		})
		require.ErrorIs(t, inner.Release(ctx), ownership.ErrNotHeld, "the lock is b's now")
		require.ErrorIs(t, outer.Err(), ownership.ErrLeaseLost)
		require.Equal(t, "b", w.field(t, "replica"))
		require.Equal(t, "1", w.count(t, "holds"), "a's hold count was written into b's lock")
		require.Equal(t, "0", w.count(t, "seq"))
		require.NoError(t, taken.Release(ctx))
	})

	// a's acquire queued it behind b; before the resend, b released and
	// handed the lock to a (the oldest waiting Locker). The resend takes
	// it: one holder, one hold, and the queue is empty.
	t.Run("AcquireAfterTheHandOff", func(t *testing.T) {
		t.Parallel()
		w := resendSetup(t, layout, "acquire")
		held, err := w.b.Acquire(ctx, w.key, 0)
		require.NoError(t, err)
		w.hook.arm("acquire", func() { require.NoError(t, held.Release(ctx)) })
		le, err := w.a.Acquire(ctx, w.key, 0)
		require.NoError(t, err)
		first, _ := w.hook.first.([]any)
		require.NotEmpty(t, first)
		require.EqualValues(t, 0, first[0], "the first send found the lock held (and queued a)")
		require.Equal(t, "a", w.field(t, "replica"))
		require.Equal(t, "1", w.count(t, "holds"))
		require.Equal(t, itoa(le.Fence()), w.field(t, "fence"))
		n, err := w.env.Client.ZCard(ctx, w.env.Prefix+":{"+w.key+"}:queue").Result()
		require.NoError(t, err)
		require.Zero(t, n, "a left the queue when it took the lock")
		// b waits this long, then is told a holds it. Not a whole second:
		// a waiter asks again every second, and a deadline that ends an ask
		// in flight is "unavailable" (its outcome is unknown; CI met that
		// with 2 s).
		bctx, cancel := context.WithTimeout(ctx, 2500*time.Millisecond)
		defer cancel()
		_, err = w.b.Acquire(bctx, w.key, 0)
		require.ErrorIs(t, err, ownership.ErrAlreadyOwned, "a holds it")
		require.NoError(t, le.Release(ctx))
	})
}

// A renewal that reaches Redis only after the holder's lease ran out and
// another holder took the lock (the request was delayed, then resent):
// neither send extends or otherwise touches the new holder's lock.
func TestLateRenewalCannotExtendTheNextHolder(t *testing.T) {
	t.Parallel()
	forLayouts(t, lateRenewalCannotExtendTheNextHolder)
}

func lateRenewalCannotExtendTheNextHolder(t *testing.T, layout redislock.Layout) {
	const ttl = 1500 * time.Millisecond
	env := testenv.Redis(t)
	ctx := context.Background()
	client, err := redislock.NewClient(env.URL, redislock.ModeSingle)
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	held := &holdRenewals{captured: make(chan []any, 1)}
	client.AddHook(held)
	a, err := redislock.New(client, redislock.Config{Prefix: env.Prefix, Owner: "a", WatchdogTimeout: ttl, Layout: layout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	b := newLayoutLocker(t, env.URL, redislock.ModeSingle, env.Prefix, layout, ownershipOptions("b", 10*time.Second, ttl))
	key := keyIn(layout, env.Prefix, "late")

	le, err := a.Acquire(ctx, key, 0)
	require.NoError(t, err)
	var args []any
	select {
	case args = <-held.captured: // a's first renewal, kept from Redis
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal was sent")
	}
	select {
	case <-le.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a's lease outlived its trust deadline without a renewal")
	}
	next, err := b.Acquire(ctx, key, time.Minute)
	require.NoError(t, err)
	lockKey := lockKeyIn(layout, env.Prefix, key)
	require.NoError(t, redislock.LoadScripts(ctx, env.Client)) // the captured send may be an EVALSHA
	before, err := env.Client.PTTL(ctx, lockKey).Result()
	require.NoError(t, err)

	for range 2 { // the late send and its resend
		n, err := env.Client.Do(ctx, args...).Int64()
		require.NoError(t, err)
		require.Zero(t, n, "a's late renewal claimed b's lock")
	}
	after, err := env.Client.PTTL(ctx, lockKey).Result()
	require.NoError(t, err)
	require.Greater(t, after, ttl, "a's late renewal cut b's minute-long lease to a's TTL")
	require.LessOrEqual(t, after, before)
	require.NoError(t, next.Err())
	require.NoError(t, next.Release(ctx))
}

// holdRenewals keeps every renewal (pipeline) from Redis (it fails as a
// network error would) and hands the first renewal's command to the test.
type holdRenewals struct {
	once     sync.Once
	captured chan []any
}

func (h *holdRenewals) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdRenewals) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return asProcessHook(h.ProcessPipelineHook, next)
}
func (h *holdRenewals) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if redislock.ScriptName(c) == "renew" {
				h.once.Do(func() {
					h.captured <- append([]any(nil), c.Args()...)
				})
				err := context.DeadlineExceeded
				for _, c := range cmds {
					c.SetErr(err)
				}
				return err
			}
		}
		return next(ctx, cmds)
	}
}
