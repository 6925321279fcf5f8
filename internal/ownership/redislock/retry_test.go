package redislock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/ownershiptest"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// go-redis resends a command whose reply did not come within ReadTimeout
// (MaxRetries=1, ReadTimeout=2s in NewClient). When Redis stalls longer
// than that (a fork, a slow command, DEBUG SLEEP here), the first send runs
// when the stall ends and the resend runs right after it: every lock script
// runs twice. These tests stall a throwaway Redis exactly while one script
// is in flight and check what the lock promises: never two holders, no
// spurious loss, no leftover lock.

const stallFor = 3 * time.Second // past DefaultReadTimeout, so go-redis resends

// stallHook stalls srv once, right before the first command (or pipeline)
// that runs the named script is sent, and records how long that send took.
type stallHook struct {
	t      *testing.T
	srv    *testenv.RedisServer
	script string

	mu      sync.Mutex
	armed   bool
	stall   time.Duration
	started chan struct{} // closed once the server is stalled and the command is on its way
	done    chan struct{} // closed when the stalled command returned
	took    time.Duration
	err     error
}

func newStallHook(t *testing.T, srv *testenv.RedisServer) *stallHook {
	return &stallHook{t: t, srv: srv, stall: stallFor, started: make(chan struct{}), done: make(chan struct{})}
}

// arm makes the next command running script stall the server first.
func (h *stallHook) arm(script string) {
	h.mu.Lock()
	h.armed, h.script = true, script
	h.mu.Unlock()
}

func (h *stallHook) fire(cmds []redis.Cmder) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.armed {
		return false
	}
	for _, c := range cmds {
		if redislock.ScriptName(c) == h.script {
			h.armed = false
			return true
		}
	}
	return false
}

func (h *stallHook) run(send func() error) error {
	stalled := h.srv.Stall(h.t, h.stall)
	close(h.started)
	start := time.Now()
	err := send()
	h.took, h.err = time.Since(start), err
	<-stalled
	close(h.done)
	return err
}

func (h *stallHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *stallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.fire([]redis.Cmder{cmd}) {
			return h.run(func() error { return next(ctx, cmd) })
		}
		return next(ctx, cmd)
	}
}
func (h *stallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.fire(cmds) {
			return h.run(func() error { return next(ctx, cmds) })
		}
		return next(ctx, cmds)
	}
}

// wait waits for the stalled command and checks the stall really made
// go-redis resend it (it took longer than the read timeout).
func (h *stallHook) wait() {
	h.t.Helper()
	select {
	case <-h.done:
	case <-time.After(30 * time.Second):
		h.t.Fatal("the stalled script was never sent")
	}
	require.Greater(h.t, h.took, redislock.DefaultReadTimeout, "the stall did not outlast the read timeout: no resend happened")
}

type retryWorld struct {
	layout  redislock.Layout
	srv     *testenv.RedisServer
	hook    *stallHook
	a, b    *redislock.Locker // a's client stalls; b contends
	admin   *redis.Client
	lockKey string
	key     string
}

func retrySetup(t *testing.T, layout redislock.Layout, watchdog time.Duration) *retryWorld {
	return retrySetupWait(t, layout, watchdog, 10*time.Second)
}

func retrySetupWait(t *testing.T, layout redislock.Layout, watchdog, wait time.Duration) *retryWorld {
	t.Helper()
	srv := testenv.StartRedisServerWith(t, testenv.RedisServerOptions{Args: []string{"--enable-debug-command", "yes"}})
	w := &retryWorld{layout: layout, srv: srv, hook: newStallHook(t, srv), admin: srv.Client(t), key: "retried"}
	w.lockKey = lockKeyIn(layout, "rt", w.key)
	client, err := redislock.NewClient(srv.URL(), redislock.ModeSingle)
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	require.NoError(t, redislock.LoadScripts(context.Background(), w.admin))
	// Idle pooled connections, so that go-redis resends on one at once
	// instead of dialling (a dial's handshake would wait out the stall).
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { _ = client.Ping(context.Background()).Err() })
	}
	wg.Wait()
	client.AddHook(w.hook)
	w.a, err = redislock.New(client, redislock.Config{Prefix: "rt", Owner: "a", WaitTime: wait, WatchdogTimeout: watchdog, Layout: layout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.a.Close() })
	w.b = newLayoutLocker(t, srv.URL(), redislock.ModeSingle, "rt", layout, ownershipOptions("b", 300*time.Millisecond, watchdog))
	return w
}

// excluded checks that b cannot take the key (someone holds it).
func (w *retryWorld) excluded(t *testing.T) {
	t.Helper()
	le, err := w.b.Acquire(context.Background(), w.key, 0)
	if err == nil {
		_ = le.Release(context.Background())
		t.Fatal("a second holder acquired the lock while the first still held it")
	}
	require.ErrorIs(t, err, ownership.ErrAlreadyOwned)
}

// gone checks that nothing is left of the lock and b takes it at once.
func (w *retryWorld) gone(t *testing.T) {
	t.Helper()
	owner, err := w.admin.HGet(context.Background(), w.lockKey, "owner").Result()
	require.ErrorIs(t, err, redis.Nil, "the lock outlived every release (owner %q)", owner)
	le, err := w.b.Acquire(context.Background(), w.key, 0)
	require.NoError(t, err)
	require.NoError(t, le.Release(context.Background()))
}

// cleanedUp waits (bounded) until the lock a failed acquire may have
// written is gone, and far sooner than its TTL (10s).
func (w *retryWorld) cleanedUp(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := w.admin.HGet(context.Background(), w.lockKey, "owner").Result()
		return err == redis.Nil
	}, 5*time.Second, 10*time.Millisecond, "the failed acquire's lock was left for its TTL")
	w.gone(t)
}

// holds is the hold count the lock hash records: its holds field, or 1 when
// the hash has an owner and no holds field (no reentry yet).
func (w *retryWorld) holds(t *testing.T) string {
	t.Helper()
	vals, err := w.admin.HMGet(context.Background(), w.lockKey, "owner", "holds").Result()
	require.NoError(t, err)
	require.NotNil(t, vals[0], "the lock is not held")
	if vals[1] == nil {
		return "1"
	}
	return vals[1].(string)
}

// A release whose context ends while a renewal batch is stuck in a stalled
// Redis returns by its context instead of waiting for the batch, and the lock
// it could not delete is deleted by token once Redis answers again.
func TestReleaseDoesNotWaitOutAStalledRenewal(t *testing.T) {
	t.Parallel()
	forLayouts(t, func(t *testing.T, layout redislock.Layout) {
		releaseDoesNotWaitOutAStalledRenewal(t, layout)
	})
}

func releaseDoesNotWaitOutAStalledRenewal(t *testing.T, layout redislock.Layout) {
	w := retrySetup(t, layout, 9*time.Second)
	ctx := context.Background()
	w.hook.arm("renew")
	le, err := w.a.Acquire(ctx, w.key, 0)
	require.NoError(t, err)
	<-w.hook.started // the first renewal (at 3s) is stuck behind DEBUG SLEEP 3
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = le.Release(rctx)
	took := time.Since(start)
	require.ErrorIs(t, err, ownership.ErrUnavailable, "Redis is stalled: the release cannot have run")
	require.Less(t, took, stallFor-time.Second, "Release waited for the stalled renewal batch, not for its context")
	w.hook.wait()
	w.cleanedUp(t)
}

// holdReplyHook lets the first renewal run in Redis on time, but keeps its
// reply from the Locker until release is closed: a reply that arrives after
// the holder's trust deadline (a slow return path, a paused client).
type holdReplyHook struct {
	once    sync.Once
	ran     chan struct{}
	release chan struct{}
}

func (h *holdReplyHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdReplyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return asProcessHook(h.ProcessPipelineHook, next)
}
func (h *holdReplyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if redislock.ScriptName(c) == "renew" {
				h.once.Do(func() { close(h.ran); <-h.release })
				break
			}
		}
		return err
	}
}

// A renewal whose reply lands after the holder's trust deadline extended a
// lock nobody holds any more: it is deleted by token, instead of living for
// the TTL the renewal set.
func TestLateRenewalIsCleanedUp(t *testing.T) {
	t.Parallel()
	forLayouts(t, lateRenewalIsCleanedUp)
}

func lateRenewalIsCleanedUp(t *testing.T, layout redislock.Layout) {
	// TTL 9s: the renewal runs at 3s and sets the lock to live until 12s;
	// the holder, never told, stops trusting at 8.55s.
	const ttl = 9 * time.Second
	srv := startThrowaway(t)
	ctx := context.Background()
	client, err := redislock.NewClient(srv.URL(), redislock.ModeSingle)
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	h := &holdReplyHook{ran: make(chan struct{}), release: make(chan struct{})}
	client.AddHook(h)
	l, err := redislock.New(client, redislock.Config{Prefix: "late", Owner: "a", WatchdogTimeout: ttl, Layout: layout})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	t.Cleanup(func() { h.once.Do(func() {}); closeOnce(h.release) })
	admin := srv.Client(t)
	require.NoError(t, redislock.LoadScripts(ctx, admin)) // the renewal is one EVALSHA, no NOSCRIPT round

	le, err := l.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	<-h.ran
	select {
	case <-le.Done():
	case <-time.After(2 * ttl):
		t.Fatal("the lease outlived its trust deadline")
	}
	lost := time.Now()
	require.ErrorIs(t, le.Err(), ownership.ErrLeaseLost)
	closeOnce(h.release) // the late "renewed" reply arrives now
	// The renewal set the lock to live until ~12s; it must go well before.
	require.Eventually(t, func() bool {
		_, err := admin.HGet(ctx, lockKeyIn(layout, "late", "k"), "owner").Result()
		return err == redis.Nil
	}, 2*time.Second, 10*time.Millisecond, "a lock extended for nobody was left for its TTL")
	t.Logf("deleted %s after the trust deadline", time.Since(lost))
}

func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}

func TestRetriedScripts(t *testing.T) {
	t.Parallel()
	forLayouts(t, retriedScripts)
}

func retriedScripts(t *testing.T, layout redislock.Layout) {
	ctx := context.Background()

	t.Run("Acquire", func(t *testing.T) {
		t.Parallel()
		w := retrySetup(t, layout, 10*time.Second)
		w.hook.arm("acquire")
		le, err := w.a.Acquire(ctx, w.key, 0)
		w.hook.wait()
		require.NoError(t, err)
		require.Equal(t, "1", w.holds(t), "a resent acquire counted a hold twice")
		w.excluded(t)
		require.NoError(t, le.Release(ctx))
		w.gone(t)
	})

	// The acquire's reply does not come within the wait budget (1s, below
	// the read timeout, so go-redis does not resend): Acquire fails closed
	// as unavailable, and the lock the stalled script writes when the
	// stall ends is deleted by its token rather than left for a whole TTL.
	t.Run("AcquireReplyLost", func(t *testing.T) {
		t.Parallel()
		w := retrySetupWait(t, layout, 10*time.Second, time.Second)
		w.hook.arm("acquire")
		_, err := w.a.Acquire(ctx, w.key, 0)
		<-w.hook.done
		require.ErrorIs(t, err, ownership.ErrUnavailable)
		w.cleanedUp(t)
	})

	// The caller's ctx ends while the acquire script is in flight: that is
	// unavailable (Redis did not answer), not already_owned, and the lock
	// is cleaned up.
	t.Run("AcquireCancelled", func(t *testing.T) {
		t.Parallel()
		w := retrySetup(t, layout, 10*time.Second)
		w.hook.arm("acquire")
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := w.a.Acquire(cctx, w.key, 0)
		<-w.hook.done
		require.ErrorIs(t, err, ownership.ErrUnavailable)
		require.NotErrorIs(t, err, ownership.ErrAlreadyOwned)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		w.cleanedUp(t)
	})

	t.Run("Reenter", func(t *testing.T) {
		t.Parallel()
		w := retrySetup(t, layout, 10*time.Second)
		outer, err := w.a.Acquire(ctx, w.key, 0)
		require.NoError(t, err)
		w.hook.arm("holds")
		inner, err := w.a.Acquire(outer.Context(), w.key, 0)
		w.hook.wait()
		require.NoError(t, err)
		require.Equal(t, "2", w.holds(t), "a resent reentry counted a hold twice")
		require.NoError(t, inner.Release(ctx))
		w.excluded(t)
		require.NoError(t, outer.Release(ctx))
		w.gone(t)
	})

	t.Run("ReleaseOfReentered", func(t *testing.T) {
		t.Parallel()
		w := retrySetup(t, layout, 10*time.Second)
		outer, err := w.a.Acquire(ctx, w.key, 0)
		require.NoError(t, err)
		inner, err := w.a.Acquire(outer.Context(), w.key, 0)
		require.NoError(t, err)
		w.hook.arm("holds")
		require.NoError(t, inner.Release(ctx))
		w.hook.wait()
		require.NoError(t, outer.Err(), "the outer hold must survive a resent inner release")
		w.excluded(t)
		require.NoError(t, outer.Release(ctx))
		w.gone(t)
	})

	t.Run("Release", func(t *testing.T) {
		t.Parallel()
		w := retrySetup(t, layout, 10*time.Second)
		le, err := w.a.Acquire(ctx, w.key, 0)
		require.NoError(t, err)
		w.hook.arm("release")
		require.NoError(t, le.Release(ctx), "a resent release of a held lock must not report it not held")
		w.hook.wait()
		require.ErrorIs(t, le.Err(), ownership.ErrReleased)
		w.gone(t)
	})

	t.Run("Renew", func(t *testing.T) {
		t.Parallel()
		// TTL 9s: the first renewal goes out at 3s and, stalled, comes back
		// at about 6s, well inside the trust deadline (8.5s).
		const ttl = 9 * time.Second
		w := retrySetup(t, layout, ttl)
		w.hook.arm("renew")
		le, err := w.a.Acquire(ctx, w.key, 0)
		require.NoError(t, err)
		w.hook.wait()
		require.NoError(t, le.Err(), "a resent renewal must not lose the lease")
		pttl, err := w.admin.PTTL(ctx, w.lockKey).Result()
		require.NoError(t, err)
		require.Greater(t, pttl, ttl-3*time.Second, "the renewal did not reset the TTL")
		w.excluded(t)
		require.NoError(t, le.Release(ctx))
		w.gone(t)
	})
}

func ownershipOptions(owner string, wait, watchdog time.Duration) ownershiptest.Options {
	return ownershiptest.Options{Owner: owner, WaitTime: wait, WatchdogTimeout: watchdog}
}

// layouts: the tests of the lock's guarantees run in both (the redisson
// layout keeps every promise the coordinator's makes to its own holders).
var layouts = []redislock.Layout{redislock.LayoutCoordinator, redislock.LayoutRedisson}

// forLayouts runs test once per layout, in parallel subtests named after it.
func forLayouts(t *testing.T, test func(t *testing.T, layout redislock.Layout)) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			t.Parallel()
			test(t, layout)
		})
	}
}

// lockKeyIn is the Redis key of key's lock in layout.
func lockKeyIn(layout redislock.Layout, prefix, key string) string {
	if layout == redislock.LayoutRedisson {
		return key
	}
	return prefix + ":{" + key + "}:lock"
}

// keyIn is a lock key named name for a test on the shared Redis: in the
// redisson layout the lock is the bare name, so it carries the test's
// prefix (deleted when the test ends, and no other test's).
func keyIn(layout redislock.Layout, prefix, name string) string {
	if layout == redislock.LayoutRedisson {
		return prefix + ":" + name
	}
	return name
}
