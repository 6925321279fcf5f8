package lockrun

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// The command's environment: what removed reports is gone unless --pass-env
// names it; the lock's own variables replace inherited ones; the rest is
// kept as it was, in order.
func TestCommandEnv(t *testing.T) {
	t.Parallel()
	removed := func(name string) bool { return strings.HasPrefix(name, "SECRET_") }
	env := commandEnv([]string{
		"PATH=/bin", "SECRET_A=1", "SECRET_B=2", "COORDINATOR_LOCK_KEY=outer", "KEEP=x=y", "COORDINATOR_LOCK_FENCE=1",
	}, removed, []string{"SECRET_B"}, "k", "me", 42)
	require.Equal(t, []string{
		"PATH=/bin", "SECRET_B=2", "KEEP=x=y",
		"COORDINATOR_LOCK_KEY=k", "COORDINATOR_LOCK_OWNER=me", "COORDINATOR_LOCK_FENCE=42",
	}, env)
	require.Len(t, commandEnv([]string{"SECRET_A=1"}, nil, nil, "k", "me", 1), 4, "nil removes nothing")
}

func TestLockGraceFit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		lease    time.Duration // 0: watchdog
		ttl      time.Duration
		grace    time.Duration // 0: not given
		want     time.Duration
		refusing bool
	}{
		{"watchdog default shrinks to what fits", 0, 30 * time.Second, 0, 30*time.Second/3 - 1502*time.Millisecond - 500*time.Millisecond, false},
		{"watchdog long enough for 10s", 0, 40 * time.Second, 0, 10 * time.Second, false},
		{"watchdog given too long", 0, 30 * time.Second, 10 * time.Second, 0, true},
		{"explicit default is half of what fits", 10 * time.Second, 10 * time.Second, 0, (10*time.Second - 502*time.Millisecond - 500*time.Millisecond) / 2, false},
		{"explicit long lease keeps 10s", time.Hour, time.Hour, 0, 10 * time.Second, false},
		{"explicit given fits", 4 * time.Second, 4 * time.Second, time.Second, time.Second, false},
		{"explicit grace leaving no run time", 2 * time.Second, 2 * time.Second, 1698 * time.Millisecond, 0, true},
		{"explicit 2s lease, 5s grace", 2 * time.Second, 2 * time.Second, 5 * time.Second, 0, true},
	} {
		a := Args{Grace: defaultGrace, Lease: c.lease}
		if c.grace > 0 {
			a.Grace, a.GraceSet = c.grace, true
		}
		got, err := fitGrace(a, c.ttl, c.lease == 0)
		if c.refusing {
			require.Error(t, err, c.name)
			continue
		}
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, got, c.name)
	}
}

func TestParseArgs(t *testing.T) {
	t.Parallel()
	a, err := ParseArgs([]string{"--key", "k", "--lease=5s", "--log-level", "warn", "--wait", "0", "--pass-env", "PGPASSWORD",
		"--lock-enabled=false", "--pass-env=REDIS_URL", "--", "sh", "-c", "exit 3"})
	require.NoError(t, err)
	require.Equal(t, []string{"PGPASSWORD", "REDIS_URL"}, a.PassEnv)
	require.Equal(t, "k", a.Key)
	require.Equal(t, 5*time.Second, a.Lease)
	require.True(t, a.WaitSet)
	require.Zero(t, a.Wait)
	require.False(t, a.GraceSet)
	require.Equal(t, defaultGrace, a.Grace)
	require.Equal(t, []string{"--log-level", "warn", "--lock-enabled=false"}, a.Config)
	require.Equal(t, []string{"sh", "-c", "exit 3"}, a.Argv)

	for _, bad := range [][]string{
		{"--", "true"},
		{"--key", "k"},
		{"--key", "k", "--"},
		{"--key", "bad key", "--", "true"},
		{"--key", "k", "--lease", "soon", "--", "true"},
		{"--key", "k", "--grace", "-1s", "--", "true"},
		{"--key", "k", "stray", "--", "true"},
		{"--key", "k", "--pass-env", "1X", "--", "true"},
		{"--key", "k", "--pass-env", "A=B", "--", "true"},
		{"--key", "k", "--pass-env", "COORDINATOR_LOCK_FENCE", "--", "true"},
		{"--key", "k", "--pass-env", "--", "true"},
	} {
		_, err := ParseArgs(bad)
		require.Error(t, err, "%q", bad)
	}
}

// Run in this process, on the in-memory Locker: the command sees the
// lock's variables, its exit status is Run's, and the lock is released
// when it ends.
func TestRunInProcess(t *testing.T) {
	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "in-process"})
	t.Cleanup(func() { _ = locker.Close() })
	a, err := ParseArgs([]string{"--key", "inproc", "--", "sh", "-c", `echo "$COORDINATOR_LOCK_KEY $COORDINATOR_LOCK_OWNER"; exit 7`})
	require.NoError(t, err)
	var out, errs bytes.Buffer
	code := Run(context.Background(), Config{
		Args: a, WatchdogTimeout: 30 * time.Second,
		Open:   func(context.Context, time.Duration) (ownership.Locker, error) { return unclosable{locker}, nil },
		Stdout: &out, Stderr: &errs,
		Environ: []string{"PATH=" + os.Getenv("PATH")},
	})
	require.Equal(t, 7, code, errs.String())
	require.Equal(t, "inproc in-process\n", out.String())
	le, err := locker.Acquire(context.Background(), "inproc", 0)
	require.NoError(t, err, "released when the command ended")
	require.NoError(t, le.Release(context.Background()))
}

// unclosable keeps Run's Close from closing the test's Locker.
type unclosable struct{ ownership.Locker }

func (unclosable) Close() error { return nil }

// --pass-env of a variable the command gets anyway is a mistake (a typo,
// most likely): refused before anything is locked.
func TestRunRefusesAPassEnvThatRemovesNothing(t *testing.T) {
	t.Parallel()
	a, err := ParseArgs([]string{"--key", "k", "--pass-env", "HOME", "--", "true"})
	require.NoError(t, err)
	var errs bytes.Buffer
	opened := false
	code := Run(context.Background(), Config{
		Args: a, WatchdogTimeout: 30 * time.Second, Stderr: &errs,
		Removed: func(name string) bool { return name == "SECRET" },
		Open:    func(context.Context, time.Duration) (ownership.Locker, error) { opened = true; return nil, nil },
	})
	require.Equal(t, 64, code)
	require.Contains(t, errs.String(), "--pass-env HOME")
	require.False(t, opened, "nothing was locked")
}

// The wait budget covers an unavailable backend: asked again with backoff
// until it answers, and no longer than the budget; a zero wait is one try;
// a lock held past the budget is already owned, not unavailable.
func TestAcquireWithin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	newLocker := func() *ownership.MemoryLocker {
		l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "me", WaitTime: 300 * time.Millisecond})
		t.Cleanup(func() { _ = l.Close() })
		return l
	}

	l := newLocker()
	l.SetUnavailable(true)
	_, err := acquireWithin(ctx, l, "k", 0, 0, log)
	require.ErrorIs(t, err, ownership.ErrUnavailable, "--wait 0: one try")

	back := time.AfterFunc(400*time.Millisecond, func() { l.SetUnavailable(false) })
	t.Cleanup(func() { back.Stop() })
	le, err := acquireWithin(ctx, l, "k", 0, 30*time.Second, log)
	require.NoError(t, err, "asked again until the backend answered")
	require.NoError(t, le.Release(ctx))

	l = newLocker()
	l.SetUnavailable(true)
	start := time.Now()
	_, err = acquireWithin(ctx, l, "k", 0, 300*time.Millisecond, log)
	require.ErrorIs(t, err, ownership.ErrUnavailable)
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "the whole budget was used")

	l = newLocker()
	held, err := l.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	_, err = acquireWithin(ctx, l, "k", 0, 300*time.Millisecond, log)
	require.ErrorIs(t, err, ownership.ErrAlreadyOwned)
	require.NoError(t, held.Release(ctx))
}

// Asked again after the backend was unavailable, a lock that another holder
// keeps is waited for only as long as is left of the budget, not a whole
// wait of the retry's own (nor a grace past the budget): a holder that
// releases after the budget must not see the waiter take the lock and run
// its command late.
func TestAcquireWithinEndsARetriedWaitWithTheBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const wait = time.Second
	// The Locker's own wait is the budget, as coordinator lock opens it.
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "me", WaitTime: wait})
	t.Cleanup(func() { _ = l.Close() })
	held, err := l.Acquire(ctx, "k", 0)
	require.NoError(t, err)
	l.SetUnavailable(true)
	back := time.AfterFunc(400*time.Millisecond, func() { l.SetUnavailable(false) })
	t.Cleanup(func() { back.Stop() })
	// Released after the budget: too late for this waiter.
	late := time.AfterFunc(wait+300*time.Millisecond, func() { _ = held.Release(ctx) })
	t.Cleanup(func() { late.Stop() })

	start := time.Now()
	le, err := acquireWithin(ctx, l, "k", 0, wait, slog.New(slog.DiscardHandler))
	took := time.Since(start)
	if le != nil {
		_ = le.Release(ctx)
	}
	require.ErrorIs(t, err, ownership.ErrAlreadyOwned, "taken %s after a %s budget", took, wait)
}

// lostLeases hands out leases already lost, their lock gone, for its first
// lose acquisitions (as a stall between the acquire's answer and the
// command's start leaves them), then good ones.
type lostLeases struct {
	ownership.Locker
	mu       sync.Mutex
	lose     int
	acquired int
}

func (l *lostLeases) Acquire(ctx context.Context, key string, ttl time.Duration) (ownership.Lease, error) {
	le, err := l.Locker.Acquire(ctx, key, ttl)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acquired++
	if l.acquired <= l.lose { // its lock expired meanwhile
		if err := le.Release(ctx); err != nil {
			return nil, err
		}
		return lostLease{le}, nil
	}
	return le, nil
}

func (*lostLeases) Close() error { return nil }

type lostLease struct{ ownership.Lease }

func (lostLease) Err() error { return ownership.ErrLeaseLost }

// An acquisition lost before the command could start is given back and the
// lock asked for again within --wait; the command runs once, and its exit
// status is lock's. With the budget spent the command does not run: 69.
// Before, lock exited 76 (lost) for a command that never ran, with budget
// left.
func TestAnAcquisitionLostBeforeTheStartIsAskedForAgain(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, wait time.Duration, lose int) (int, *lostLeases, string, string) {
		mem := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "me"})
		t.Cleanup(func() { _ = mem.Close() })
		locker := &lostLeases{Locker: mem, lose: lose}
		a, err := ParseArgs([]string{"--key", "lost-first", "--", "sh", "-c", "echo ran; exit 7"})
		require.NoError(t, err)
		var out, errs, logs bytes.Buffer
		code := Run(context.Background(), Config{
			Args: a, WatchdogTimeout: 30 * time.Second, Wait: wait,
			Open:   func(context.Context, time.Duration) (ownership.Locker, error) { return locker, nil },
			Stdout: &out, Stderr: &errs, Log: slog.New(slog.NewJSONHandler(&logs, nil)),
			Environ: []string{"PATH=" + os.Getenv("PATH")},
		})
		le, err := mem.Acquire(context.Background(), "lost-first", 0)
		require.NoError(t, err, "every acquisition was released")
		require.NoError(t, le.Release(context.Background()))
		return code, locker, out.String() + errs.String(), logs.String()
	}
	t.Run("budget left", func(t *testing.T) {
		code, locker, out, logs := run(t, 5*time.Second, 1)
		require.Equal(t, 7, code, out)
		require.Equal(t, "ran\n", out)
		require.Equal(t, 2, locker.acquired)
		require.Contains(t, logs, "lock_lost_before_start")
	})
	t.Run("no budget", func(t *testing.T) {
		code, locker, out, _ := run(t, 0, 1)
		require.Equal(t, 69, code, out)
		require.NotContains(t, out, "ran")
		require.Equal(t, 1, locker.acquired)
		require.Contains(t, out, "lost before the command could start")
	})
}

// --wait counts from the start: the time opening the Locker took (its
// server check against a stalled Redis) is not added on top. Before, a
// 1.5 s wait behind a held lock after a 1 s open ended at 2.5 s. The
// figures here are larger (a 2.5 s wait, a 2 s open), so that each bound
// sits a second or more from both the right answer and the wrong one: the
// bounds are the behaviour under test, and must hold on a loaded machine.
func TestWaitCountsTheLockersOpen(t *testing.T) {
	t.Parallel()
	mem := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "me", WaitTime: 2500 * time.Millisecond})
	t.Cleanup(func() { _ = mem.Close() })
	held, err := mem.Acquire(context.Background(), "slow-open", 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = held.Release(context.Background()) })
	a, err := ParseArgs([]string{"--key", "slow-open", "--", "true"})
	require.NoError(t, err)
	var errs bytes.Buffer
	start := time.Now()
	code := Run(context.Background(), Config{
		Args: a, WatchdogTimeout: 30 * time.Second, Wait: 2500 * time.Millisecond, Stderr: &errs,
		Open: func(context.Context, time.Duration) (ownership.Locker, error) {
			time.Sleep(2 * time.Second) // a server check that waited for a stalled Redis
			return memUnclosable{mem}, nil
		},
		Environ: []string{"PATH=" + os.Getenv("PATH")},
	})
	took := time.Since(start)
	require.Equal(t, 75, code, errs.String())
	// Right: 2.5 s; the open added on top: 4.5 s.
	require.Less(t, took, 3500*time.Millisecond, "the 2.5 s budget included the 2 s open")

	// An open that took the whole budget leaves one try, not the Locker's
	// own wait (--wait) on top.
	start = time.Now()
	code = Run(context.Background(), Config{
		Args: a, WatchdogTimeout: 30 * time.Second, Wait: 2500 * time.Millisecond, Stderr: &errs,
		Open: func(context.Context, time.Duration) (ownership.Locker, error) {
			time.Sleep(3 * time.Second)
			return memUnclosable{mem}, nil
		},
		Environ: []string{"PATH=" + os.Getenv("PATH")},
	})
	took = time.Since(start)
	require.Equal(t, 75, code, errs.String())
	// Right: 3 s and one try; the Locker's own 2.5 s wait on top: 5.5 s.
	require.Less(t, took, 4300*time.Millisecond, "one try after an open that spent the 2.5 s budget")
}

// memUnclosable keeps Run's Close from closing the test's MemoryLocker,
// keeping its AcquireWithin (ownership.WaitLocker).
type memUnclosable struct{ *ownership.MemoryLocker }

func (memUnclosable) Close() error { return nil }
