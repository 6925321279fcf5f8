package lockrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/proctree"
)

// lockRun supervises one locked command.
type lockRun struct {
	log      *slog.Logger
	key      string
	lease    ownership.Lease
	ttl      time.Duration
	watchdog bool
	grace    time.Duration
	sigs     chan os.Signal
	term     *terminal
	// probe reads the lock's remaining TTL on Redis (nil: in-memory locker).
	probe func(ctx context.Context, key string, fence int64) (time.Duration, bool, error)
	// trust is the Locker's own trust deadline of the lease, which moves
	// only with renewals that counted (nil: in-memory locker).
	trust func() (time.Time, bool)

	tree *proctree.Tree
	// deadline is the lease's trust deadline as the probe confirms it (zero:
	// none). A watchdog lease's moves with every expiry the probe confirms
	// on Redis. The whole tree must be dead before it and before the
	// Locker's own trust deadline, whichever comes first (until).
	deadline time.Time

	phase      phase
	termSent   bool      // every process got SIGTERM
	killBy     time.Time // while terminating: when SIGKILL follows
	timer      *time.Timer
	lost       bool // the lease ended, or was about to: exit 76
	signalled  int  // cancel signals received
	rootStatus *syscall.WaitStatus
	// endedTrusted: the command exited while its lease was trusted and
	// nothing had begun to terminate it for the lease's sake; its exit
	// status is the run's, whatever the release finds.
	endedTrusted bool
	rootStop     bool // the command is stopped
}

type phase int

const (
	running     phase = iota
	terminating       // SIGTERM sent (or forwarded); SIGKILL at killBy
	killing           // SIGKILL until the tree is empty
)

// termAt is when terminating must start for the tree to be dead by the
// kill margin before the deadline; killAt is when SIGKILL must go out.
func (r *lockRun) termAt() time.Time { return r.killAt().Add(-r.grace) }
func (r *lockRun) killAt() time.Time { return r.until().Add(-killMargin(r.ttl)) }

// until is the deadline the tree must be dead by (zero: none): the earlier
// of what the probe confirmed and the Locker's trust deadline. The probe
// reads the master, where a renewal may have landed that does not count
// (not acknowledged by the replicas a failover could promote); the Locker
// moves its trust deadline only with renewals that do.
func (r *lockRun) until() time.Time {
	d := r.deadline
	if r.trust != nil {
		if t, ok := r.trust(); ok && (d.IsZero() || t.Before(d)) {
			d = t
		}
	}
	return d
}

type probeResult struct {
	sent time.Time
	ttl  time.Duration
	held bool
	err  error
}

// lostBeforeStart reports whether the lease can no longer be trusted long
// enough to start the command: lost already, or past the time terminating
// would have to begin.
func (r *lockRun) lostBeforeStart() bool {
	return r.lease.Err() != nil || (!r.until().IsZero() && !time.Now().Before(r.termAt()))
}

func (r *lockRun) run(ctx context.Context, c Config, path string) int {
	argv := c.Args.Argv
	stderr := c.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	stdio, err := commandFiles(c.Stdin, c.Stdout, c.Stderr)
	if err != nil {
		_ = r.release(ctx) // logged inside; TTL expiry is the backstop
		fmt.Fprintf(stderr, "coordinator lock: start %s: %v\n", argv[0], err)
		return job.ExitFailed
	}
	cfg := proctree.Config{
		Path: path, Args: argv, Files: stdio.files,
		Env: commandEnv(c.Environ, c.Removed, c.Args.PassEnv, r.key, r.lease.Owner(), r.lease.Fence()),
	}
	if r.term != nil && r.term.foreground() == r.term.pgrp {
		cfg.TTY = r.term.f
	}
	// Stop and continue are ours to pass on from now on.
	signal.Notify(r.sigs, syscall.SIGTSTP, syscall.SIGCONT)
	tree, err := proctree.Start(cfg)
	stdio.started()
	if err != nil {
		stdio.finish()
		_ = r.release(ctx) // logged inside; TTL expiry is the backstop
		fmt.Fprintf(stderr, "coordinator lock: start %s: %v\n", argv[0], err)
		return job.ExitFailed
	}
	r.tree = tree
	if r.term != nil {
		// To hand the terminal back and forth from the background, and to
		// log there, without being stopped. The command is already exec'd
		// and keeps its own dispositions.
		signal.Ignore(syscall.SIGTTOU)
	}

	probeCtx, stopProbe := context.WithCancel(context.WithoutCancel(ctx))
	probes := make(chan probeResult)
	var probing sync.WaitGroup
	if r.probe != nil {
		probing.Go(func() { r.probeLoop(probeCtx, probes) })
	}
	r.timer = time.NewTimer(time.Hour)
	r.arm()
	r.supervise(ctx, probes)
	stopProbe()
	probing.Wait()
	r.timer.Stop()
	stdio.finish()
	if r.term != nil && r.term.foreground() == tree.Pid() {
		_ = r.term.setForeground(r.term.pgrp)
	}

	code := job.ExitFailed
	if r.rootStatus != nil {
		code = statusCode(*r.rootStatus)
	}
	err = r.release(ctx) // other failures are logged inside; TTL expiry is the backstop
	gone := errors.Is(err, ownership.ErrNotHeld) || errors.Is(err, ownership.ErrLeaseLost)
	switch {
	case r.endedTrusted:
		// The command's work ended under the lock. What became of the
		// lease afterwards (a Redis stall that outlasted the TTL, a release
		// that found the lock expired) does not make it a lost run.
		if gone {
			r.log.Warn("lock_lost_after_command", "lock_key", r.key, "fence", r.lease.Fence(), "exit_code", code,
				"detail", "the command ended while its lease was trusted; its exit status stands", "error", err)
		}
		return code
	case r.lost:
		return job.ExitLost
	case gone:
		r.log.Warn("lock_release_failed", "lock_key", r.key, "fence", r.lease.Fence(), "error", err)
		return job.ExitLost
	}
	return code
}

// supervise runs until the command and every descendant are gone.
func (r *lockRun) supervise(ctx context.Context, probes <-chan probeResult) {
	ctxDone, leaseDone := ctx.Done(), r.lease.Done()
	for {
		select {
		case ev := <-r.tree.Events():
			switch ev.Kind {
			case proctree.RootExited:
				st := ev.Status
				r.rootStatus, r.rootStop = &st, false
				r.endedTrusted = r.trusted()
				r.leftovers()
			case proctree.RootStopped:
				r.rootStop = true
				r.stopped(ev.Status.StopSignal())
			case proctree.RootContinued:
				r.rootStop = false
			case proctree.Empty:
				return
			}
		case s := <-r.sigs:
			switch s {
			case syscall.SIGTSTP:
				r.forward(syscall.SIGTSTP)
			case syscall.SIGCONT:
				r.resume()
			default:
				r.cancel(s.(syscall.Signal))
			}
		case <-ctxDone:
			// Cancelled by an embedding caller: like a first SIGTERM.
			ctxDone = nil
			r.cancel(syscall.SIGTERM)
		case <-leaseDone:
			leaseDone = nil
			if r.phase != killing {
				r.lost = true
				r.log.Error("lock_lost_killing_command", "lock_key", r.key, "fence", r.lease.Fence(), "error", r.lease.Err())
				r.kill()
			}
		case p := <-probes:
			r.probed(p)
		case <-r.timer.C:
			r.due()
		}
	}
}

// arm sets the timer to the next moment something must happen.
func (r *lockRun) arm() {
	var at time.Time
	switch r.phase {
	case running:
		if !r.until().IsZero() {
			at = r.termAt()
		}
	case terminating:
		at = r.killBy
	}
	r.timer.Stop()
	if !at.IsZero() {
		r.timer.Reset(time.Until(at))
	}
}

// due: the timer fired. Running: the lease's deadline is a grace away, so
// terminate now. Terminating: the grace is over.
func (r *lockRun) due() {
	switch r.phase {
	case running:
		if time.Now().Before(r.termAt()) {
			r.arm() // a renewal moved the trust deadline since the timer was set
			return
		}
		r.lost = true
		r.log.Error("lock_lease_ending_terminating_command", "lock_key", r.key, "fence", r.lease.Fence(),
			"trust_deadline_in_ms", time.Until(r.until()).Milliseconds(), "grace_ms", r.grace.Milliseconds())
		r.terminate(r.grace)
	case terminating:
		r.log.Error("lock_command_killed", "lock_key", r.key, "grace_ms", r.grace.Milliseconds())
		r.kill()
	}
}

// terminate sends SIGTERM to every process of the tree (continuing stopped
// ones so they can act on it) and SIGKILL after grace, but never later than
// the kill margin before the deadline, and at once if that has passed.
func (r *lockRun) terminate(grace time.Duration) {
	if r.phase == killing {
		return
	}
	if r.pastKill() {
		r.kill()
		return
	}
	if !r.termSent {
		r.termSent = true
		r.tree.Signal(syscall.SIGTERM)
		r.tree.ContinueStopped()
	}
	r.startGrace(grace)
}

// startGrace enters the terminating phase: SIGKILL at now+grace at the latest.
func (r *lockRun) startGrace(grace time.Duration) {
	by := time.Now().Add(grace)
	if !r.until().IsZero() && r.killAt().Before(by) {
		by = r.killAt()
	}
	if r.phase != terminating || by.Before(r.killBy) {
		r.killBy = by
	}
	r.phase = terminating
	r.arm()
}

// pastKill reports whether the command may no longer run: the lease ended,
// or SIGKILL should already have gone out.
func (r *lockRun) pastKill() bool {
	if r.lease.Err() != nil {
		r.lost = true
		return true
	}
	if !r.until().IsZero() && !time.Now().Before(r.killAt()) {
		r.lost = true
		return true
	}
	return false
}

func (r *lockRun) kill() {
	if r.phase == killing {
		return
	}
	r.phase = killing
	r.timer.Stop()
	r.tree.Kill()
}

// leftovers: the command exited; whatever it left running is terminated
// like a command at the end of its lease, before the lock is released.
func (r *lockRun) leftovers() {
	if r.phase == killing || r.termSent {
		return
	}
	r.termSent = true
	if n := r.tree.Signal(syscall.SIGTERM); n > 0 {
		r.log.Warn("lock_command_left_processes", "lock_key", r.key, "processes", n, "grace_ms", r.grace.Milliseconds())
		r.tree.ContinueStopped()
	}
	if r.phase == running {
		r.startGrace(r.grace)
	}
}

// cancel handles SIGINT, SIGTERM, SIGHUP, SIGQUIT: the first is forwarded to
// the command's group and SIGKILL follows after the grace; a second kills
// the whole tree at once.
func (r *lockRun) cancel(s syscall.Signal) {
	r.signalled++
	if r.signalled > 1 {
		r.log.Warn("lock_second_signal_killing_command", "lock_key", r.key, "signal", s.String())
		r.kill()
		return
	}
	r.log.Info("lock_signal_forwarded", "lock_key", r.key, "signal", s.String(), "grace_ms", r.grace.Milliseconds())
	r.forward(s)
	if r.rootStop {
		r.resume() // a stopped command cannot act on the signal
	}
	if r.phase == running {
		r.startGrace(r.grace)
	}
}

// forward sends s to the command's process group, as a terminal would; once
// the command is gone, to what it left.
func (r *lockRun) forward(s syscall.Signal) {
	if err := r.tree.SignalGroup(s); errors.Is(err, proctree.ErrRootGone) {
		r.tree.Signal(s)
	}
}

// stopped: the command was stopped. On a terminal under a job-control shell
// we stop too, after handing the terminal back, so that the shell sees the
// job stopped (otherwise it would wait for us while the terminal belongs to a
// stopped group). Nothing renews the lock while we are stopped; resume
// decides what the command may do when we are continued.
func (r *lockRun) stopped(sig syscall.Signal) {
	if r.term == nil || !r.term.mirrorStops || r.phase != running {
		return
	}
	if sig != syscall.SIGTSTP && sig != syscall.SIGTTIN && sig != syscall.SIGTTOU {
		return // a stop sent to the command on purpose is its sender's business
	}
	if r.term.foreground() == r.tree.Pid() {
		_ = r.term.setForeground(r.term.pgrp)
	}
	r.log.Info("lock_command_stopped", "lock_key", r.key, "signal", sig.String(),
		"detail", "stopping too; the lock is not renewed until continued")
	// SIGSTOP, not the command's signal: once Go has handled SIGTSTP it
	// cannot take its default action in this process again.
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
}

// resume: we were continued (SIGCONT). The command may go on only if the
// lease can still be trusted for what is left of a termination; otherwise it
// is killed while still stopped. On the terminal, if the shell gave us the
// foreground, the command gets it.
func (r *lockRun) resume() {
	if r.phase == killing {
		return
	}
	if r.pastKill() {
		r.log.Error("lock_lost_while_stopped_killing_command", "lock_key", r.key, "fence", r.lease.Fence(), "error", r.lease.Err())
		r.kill()
		return
	}
	if r.phase == running && !r.until().IsZero() && !time.Now().Before(r.termAt()) {
		r.due() // terminating continues the tree, within the safe window
		return
	}
	if r.term != nil && r.rootStatus == nil && r.term.foreground() == r.term.pgrp {
		_ = r.term.setForeground(r.tree.Pid())
	}
	r.forward(syscall.SIGCONT)
}

// probeLoop reads the lock's remaining TTL on Redis every tenth of the TTL
// (at most every 10s). A watchdog lease's deadline follows what Redis
// confirms, not what the renewals hope for; any lease whose lock is gone or
// someone else's is lost at once.
func (r *lockRun) probeLoop(ctx context.Context, out chan<- probeResult) {
	every := max(min(r.ttl/10, 10*time.Second), 10*time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		callCtx, cancel := context.WithTimeout(ctx, every)
		sent := time.Now()
		ttl, held, err := r.probe(callCtx, r.key, r.lease.Fence())
		cancel()
		select {
		case out <- probeResult{sent: sent, ttl: ttl, held: held, err: err}:
		case <-ctx.Done():
			return
		}
	}
}

func (r *lockRun) probed(p probeResult) {
	switch {
	case p.err != nil:
		r.log.Debug("lock_probe_failed", "lock_key", r.key, "error", p.err)
	case !p.held:
		if r.phase != killing {
			r.lost = true
			r.log.Error("lock_lost_killing_command", "lock_key", r.key, "fence", r.lease.Fence(), "error", "the lock is gone or someone else's")
			r.kill()
		}
	case r.watchdog:
		// Redis keeps the lock at least until sent+ttl.
		r.deadline = p.sent.Add(p.ttl - ownership.SafetyMargin(r.ttl))
		if r.phase == terminating && r.killAt().Before(r.killBy) {
			r.killBy = r.killAt()
		}
		r.arm()
	}
}

// trusted reports whether the lease can still be trusted now: not lost,
// not being terminated for its sake, and before its trust deadline.
func (r *lockRun) trusted() bool {
	if r.lost || r.lease.Err() != nil {
		return false
	}
	return r.until().IsZero() || time.Now().Before(r.until())
}

// release gives the lock up, bounded: TTL expiry is the backstop. A lease
// found lost or no longer held is returned (an error matching ErrLeaseLost
// or ErrNotHeld) for the caller to judge; other failures are logged here.
func (r *lockRun) release(ctx context.Context) error {
	if r.lease.Err() != nil {
		return r.lease.Err()
	}
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownership.ReleaseTimeout)
	defer cancel()
	err := r.lease.Release(relCtx)
	if err != nil && !errors.Is(err, ownership.ErrNotHeld) {
		r.log.Warn("lock_release_failed", "lock_key", r.key, "fence", r.lease.Fence(), "error", err)
	}
	return err
}

// statusCode is a shell's $? for a wait status.
func statusCode(ws syscall.WaitStatus) int {
	switch {
	case ws.Signaled():
		return 128 + int(ws.Signal())
	case ws.Exited():
		return ws.ExitStatus()
	}
	return job.ExitFailed
}
