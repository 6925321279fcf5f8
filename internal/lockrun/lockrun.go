// Package lockrun is `coordinator lock`: it runs a command while holding an
// ownership lock, as the root of a process tree (internal/proctree) that it
// owns down to the last descendant, and releases the lock only once the
// whole tree is gone. It forwards signals, mirrors job control on a
// terminal, terminates the command before its lease can expire, and maps
// what happened to the exit codes of docs/lock-command.md.
//
// cmd/coordinator parses the configuration flags and opens the Locker; Run
// does the rest. Run makes the calling process a child subreaper and reaps
// every child it has while the command runs, so it must not share its
// process with other code that starts children.
package lockrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// Config is one run of a command under a lock.
type Config struct {
	// Args are lock's own flags and the command (ParseArgs).
	Args Args
	// WatchdogTimeout is the TTL of a watchdog lease
	// (COORDINATOR_LOCK_WATCHDOG_TIMEOUT); it sizes the grace when
	// Args.Lease is 0.
	WatchdogTimeout time.Duration
	// Open opens the Locker, once the arguments were found usable. An error
	// is a configuration error (exit 64). Run closes the Locker. minTrust is
	// how long an acquisition must still be trusted for when it is answered
	// (the grace and the kill margin: time to stop the command before the
	// lease can end); a Locker that can be answered late (Redis) gives back
	// one answered later and waits on (redislock.Config.MinTrust).
	Open func(ctx context.Context, minTrust time.Duration) (ownership.Locker, error)
	// Log receives the run's records. Default: discard.
	Log *slog.Logger
	// Stdin, Stdout and Stderr are the command's streams; *os.File values
	// are handed on as they are, others through pipes. Run's own messages
	// go to Stderr.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Environ is the environment the command's is made from (os.Environ()).
	Environ []string
	// Wait is the wait budget (--wait, else COORDINATOR_LOCK_WAIT_TIME; the
	// Locker's WaitTime is the same): the lock is asked for until it is
	// taken or the budget is spent, through a backend that is unavailable
	// meanwhile. 0: one try.
	Wait time.Duration
	// Removed reports the variables of Environ the command does not get
	// unless --pass-env names them: what the coordinator reads as its
	// configuration (config.IsVariable). Nil removes none.
	Removed func(name string) bool
}

// cancelSignals are forwarded to the command once; a second one escalates.
var cancelSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// Run takes the lock, runs the command and returns the exit code
// docs/lock-command.md lists. Cancelling ctx is like a first SIGTERM.
func Run(ctx context.Context, c Config) int {
	a := c.Args
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	stderr := c.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	ttl, watchdog := a.Lease, a.Lease == 0
	if watchdog {
		ttl = c.WatchdogTimeout
	}
	grace, err := fitGrace(a, ttl, watchdog)
	if err != nil {
		fmt.Fprintf(stderr, "coordinator lock: %v\n", err)
		return job.ExitUsage
	}
	for _, name := range a.PassEnv {
		if c.Removed != nil && !c.Removed(name) {
			fmt.Fprintf(stderr, "coordinator lock: --pass-env %s: the command gets it anyway (only the coordinator's configuration is kept from it)\n", name)
			return job.ExitUsage
		}
	}
	path, err := exec.LookPath(a.Argv[0])
	if err != nil {
		fmt.Fprintf(stderr, "coordinator lock: %v\n", err)
		return job.ExitUsage
	}
	// The command runs as our user, and a process of the same user may
	// read another's /proc/PID/environ and mem: there our environment is as
	// it was given, secrets and all. Not dumpable, those are closed to it
	// (the command itself is dumpable again after its exec).
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintf(stderr, "coordinator lock: prctl(PR_SET_DUMPABLE): %v\n", err)
		return job.ExitFailed
	}

	// The caller leaves signals to us: the first is forwarded, a second
	// escalates, and neither skips the release.
	sigs := make(chan os.Signal, 8)
	for _, s := range cancelSignals {
		// Under nohup (SIGHUP ignored) the command inherits the ignoring;
		// catching it here would undo that.
		if !signal.Ignored(s) {
			signal.Notify(sigs, s)
		}
	}
	defer signal.Stop(sigs)

	// --wait counts from here: opening the Locker (its server check can
	// take a stalled Redis's whole timeout) is part of the wait.
	end := time.Now().Add(c.Wait)
	locker, err := c.Open(ctx, grace+killMargin(ttl))
	if err != nil {
		fmt.Fprintf(stderr, "coordinator lock: %v\n", err)
		return job.ExitUsage
	}
	defer locker.Close()

	// A signal while waiting for the lock cancels the wait.
	acqCtx, cancelAcq := context.WithCancel(ctx)
	defer cancelAcq()
	var early os.Signal
	acquiring := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		select {
		case early = <-sigs:
			cancelAcq()
		case <-acquiring:
		}
	})
	term := controllingTerminal(c.Stdin, c.Stdout, stderr)
	var (
		lease ownership.Lease
		r     *lockRun
	)
	for {
		asked := time.Now()
		lease, err = acquireWithin(acqCtx, locker, a.Key, a.Lease, max(time.Until(end), 0), log)
		if err != nil {
			break
		}
		r = newLockRun(log, locker, lease, asked, a, ttl, watchdog, grace, sigs, term)
		if acqCtx.Err() != nil || !r.lostBeforeStart() {
			break // a signal that came meanwhile is handled below
		}
		// Answered in time, but no longer to be trusted by the time the
		// command would start (a stall in between): give it back and wait
		// on within the budget; the command has not run.
		log.Warn("lock_lost_before_start", "lock_key", a.Key, "fence", lease.Fence(), "detail", "given back; waiting on within --wait")
		_ = r.release(ctx) // logged inside; TTL expiry is the backstop
		if time.Until(end) <= 0 {
			err = fmt.Errorf("%w: every acquisition of %q within --wait %s was lost before the command could start", ownership.ErrUnavailable, a.Key, c.Wait)
			break
		}
	}
	close(acquiring)
	watch.Wait()
	switch {
	case err != nil && early != nil:
		// Not "already owned": nobody else is known to have run the work.
		fmt.Fprintf(stderr, "coordinator lock: %s while waiting for the lock; the command did not run\n", early)
		return 128 + int(early.(syscall.Signal))
	case errors.Is(err, ownership.ErrAlreadyOwned):
		fmt.Fprintf(stderr, "coordinator lock: %v\n", err)
		return job.ExitAlreadyOwned
	case err != nil:
		fmt.Fprintf(stderr, "coordinator lock: %v\n", err)
		return job.ExitUnavailable
	}
	log.Info("lock_acquired", "lock_key", a.Key, "owner", lease.Owner(), "fence", lease.Fence(), "grace_ms", grace.Milliseconds())
	if early != nil {
		_ = r.release(ctx) // logged inside; TTL expiry is the backstop
		return 128 + int(early.(syscall.Signal))
	}
	return r.run(ctx, c, path)
}

// newLockRun is the supervision of one acquisition: its probe, its trust
// deadline and the deadline the command's tree must be dead by.
func newLockRun(log *slog.Logger, locker ownership.Locker, lease ownership.Lease, asked time.Time, a Args,
	ttl time.Duration, watchdog bool, grace time.Duration, sigs chan os.Signal, term *terminal) *lockRun {
	r := &lockRun{
		log: log, key: a.Key, lease: lease, ttl: ttl, watchdog: watchdog, grace: grace,
		sigs: sigs, term: term,
	}
	if p, ok := locker.(interface {
		LockTTL(ctx context.Context, key string, fence int64) (time.Duration, bool, error)
	}); ok {
		r.probe = p.LockTTL
	}
	if tl, ok := locker.(interface {
		TrustDeadline(ownership.Lease) (time.Time, bool)
	}); ok {
		r.trust = func() (time.Time, bool) { return tl.TrustDeadline(lease) }
	}
	// The lease's trust deadline: the command must be dead before it.
	acquired := asked
	if t, ok := ownership.TermOf(lease); ok {
		acquired = t.Acquired()
	}
	if !watchdog || r.probe != nil {
		// An in-memory watchdog lease is renewed in-process and cannot
		// expire under a live process; every other lease can.
		r.deadline = ownership.TrustDeadline(acquired, ttl)
	}
	return r
}

// acquireWithin asks for the lock until it is taken, another holder keeps it
// past the wait, or the wait is spent. The Locker waits out a held lock on
// its own; an unavailable backend (a Redis stall or restart, a failover, an
// unacknowledged acquisition) ends one Acquire early, and is asked again,
// with backoff, within the same budget. A zero wait is one try, as flock -n.
func acquireWithin(ctx context.Context, locker ownership.Locker, key string, lease, wait time.Duration, log *slog.Logger) (ownership.Lease, error) {
	end := time.Now().Add(wait)
	if wait <= 0 { // one try, even where the Locker's own wait is longer
		if wl, ok := locker.(ownership.WaitLocker); ok {
			return wl.AcquireWithin(ctx, key, lease, 0)
		}
		return locker.Acquire(ctx, key, lease)
	}
	// The first try too waits only for the budget given, which may be less
	// than the Locker's own wait (opening the Locker took part of it).
	var (
		le  ownership.Lease
		err error
	)
	if wl, ok := locker.(ownership.WaitLocker); ok {
		le, err = wl.AcquireWithin(ctx, key, lease, wait)
	} else {
		le, err = locker.Acquire(ctx, key, lease)
	}
	// The tries after the first wait only for what is left of the budget
	// (the Locker would give each a whole wait of its own); a Locker that
	// cannot be told is bounded by the budget plus retryTryGrace, for a try
	// still in flight when it runs out.
	retryCtx, cancel := context.WithDeadline(ctx, end.Add(retryTryGrace))
	defer cancel()
	retry := func() (ownership.Lease, error) {
		if wl, ok := locker.(ownership.WaitLocker); ok {
			return wl.AcquireWithin(retryCtx, key, lease, max(time.Until(end), 0))
		}
		return locker.Acquire(retryCtx, key, lease)
	}
	backoff := 100 * time.Millisecond
	for tries := 1; err != nil && errors.Is(err, ownership.ErrUnavailable) && ctx.Err() == nil; tries++ {
		if time.Until(end) <= 0 {
			break
		}
		level := slog.LevelDebug
		if tries == 1 {
			level = slog.LevelWarn
		}
		log.Log(ctx, level, "lock_backend_unavailable_waiting", "lock_key", key, "tries", tries, "error", err)
		t := time.NewTimer(min(backoff, time.Until(end)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
		le, err = retry()
	}
	return le, err
}

// retryTryGrace is how long past the wait a retried Acquire still in flight
// may take to be answered.
const retryTryGrace = time.Second
