package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/proctree"
)

func init() {
	register(command{
		name:        "lock",
		summary:     "--key K [--lease D] [--wait D] [--grace D] -- CMD ARGS...: run a command holding a lock",
		run:         runLock,
		ownsSignals: true,
	})
}

const lockUsage = `usage: coordinator lock --key KEY [--lease D] [--wait D] [--grace D] [config flags] -- CMD [ARGS...]

Runs CMD while holding the ownership lock on KEY (a distributed flock), and
releases the lock only when CMD and every process it started are gone.
  --key    lock key (required; 1-200 of A-Z a-z 0-9 . _ : / -)
  --lease  explicit lease (the lock hard-expires after it); default 0 = watchdog lease
           (TTL COORDINATOR_LOCK_WATCHDOG_TIMEOUT, renewed while CMD runs)
  --wait   max time to wait for the lock (0: one try, as flock -n); default COORDINATOR_LOCK_WAIT_TIME
  --grace  time between SIGTERM and SIGKILL when CMD must stop; default 10s, or the
           most that fits: CMD is always dead before the lock can expire, so
           SIGTERM goes out grace + a kill margin before the lease's trust deadline
           (explicit: lease - lease/20; watchdog: when the last confirmed expiry is
           a third of the TTL away). A --grace that cannot fit is refused (64).
The process tree: CMD runs in a process group of its own (on a terminal: the
foreground group). coordinator is a child subreaper, so processes that leave
the group (setsid, double fork) stay its descendants. When CMD exits, whatever
it left behind gets SIGTERM, then SIGKILL after the grace; then the lock is
released. If the lock is found gone or taken over, the tree gets SIGKILL at once.
Signals: SIGINT, SIGTERM, SIGHUP, SIGQUIT are forwarded once to CMD's group, and
SIGKILL follows after the grace; a second one kills the tree at once. SIGTSTP
and SIGCONT are forwarded. On a terminal, Ctrl-Z stops CMD and then coordinator;
nothing renews the lock while stopped, and on fg/bg CMD is continued only if
the lease can still be trusted for a whole termination, else it is killed (76).
CMD sees COORDINATOR_LOCK_KEY, COORDINATOR_LOCK_OWNER, COORDINATOR_LOCK_FENCE and
the environment without the coordinator's secrets (COORDINATOR_* variables
naming a URL, DSN, PASSWORD, TOKEN, SECRET, CREDENTIAL or a *_KEY_FILE).
Exit: CMD's own code (128+N if killed by signal N); 75 already owned; 69 lock
backend unavailable; 76 lease lost or ending while CMD ran; 64 bad usage;
1 CMD could not be started; 128+N signal N while waiting for the lock (CMD
did not run).`

// defaultGrace is --grace when not given, if the lease leaves room for it.
const defaultGrace = 10 * time.Second

type lockArgs struct {
	key          string
	lease, grace time.Duration
	graceSet     bool
	wait         time.Duration
	waitSet      bool
	rest         []string // configuration flags
	argv         []string
}

// parseLockArgs takes lock's own flags out of args; the others are
// configuration flags for loadConfig. The command follows "--".
func parseLockArgs(args []string) (lockArgs, error) {
	a := lockArgs{grace: defaultGrace}
	i := 0
	for ; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			a.argv = args[i+1:]
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !strings.HasPrefix(arg, "-") {
			return a, fmt.Errorf("unexpected argument %q (the command goes after --)", arg)
		}
		switch name {
		case "key", "lease", "wait", "grace":
		default:
			a.rest = append(a.rest, arg)
			if !hasVal && i+1 < len(args) && args[i+1] != "--" && !strings.HasPrefix(args[i+1], "-") {
				i++
				a.rest = append(a.rest, args[i])
			}
			continue
		}
		if !hasVal {
			if i+1 >= len(args) || args[i+1] == "--" {
				return a, fmt.Errorf("--%s needs a value", name)
			}
			i++
			val = args[i]
		}
		if name == "key" {
			a.key = val
			continue
		}
		d, err := time.ParseDuration(val)
		if err != nil || d < 0 {
			return a, fmt.Errorf("--%s %q is not a non-negative duration", name, val)
		}
		switch name {
		case "lease":
			a.lease = d
		case "wait":
			a.wait, a.waitSet = d, true
		case "grace":
			a.grace, a.graceSet = d, true
		}
	}
	switch {
	case a.key == "":
		return a, errors.New("--key is required")
	case len(a.argv) == 0:
		return a, errors.New("no command after --")
	}
	if err := ownership.ValidateKey(a.key); err != nil {
		return a, err
	}
	return a, nil
}

// killMargin is how long before the lease's trust deadline SIGKILL goes out:
// time for the kernel to end the processes and for us to reap them.
func killMargin(ttl time.Duration) time.Duration { return min(500*time.Millisecond, ttl/10) }

// maxGrace is the longest grace that still has the command dead before the
// lock can expire. An explicit lease gives the whole lease (less the safety
// margin and the kill margin). A watchdog lease gives a third of its TTL: the
// termination starts when the lock's confirmed expiry is that close, which
// in normal operation it never is (a renewal every third of the TTL moves
// it), so one late renewal is tolerated and a failing one is not waited out.
func maxGrace(ttl time.Duration, watchdog bool) time.Duration {
	window := ttl
	if watchdog {
		window = ttl / 3
	}
	return window - ownership.SafetyMargin(ttl) - killMargin(ttl)
}

// fitGrace returns the grace to use, or an error naming why it cannot fit.
// Without --grace: 10s, or less if the lease needs it: the most that fits a
// watchdog lease (its termination does not start in normal operation), half
// of what fits an explicit lease (whose end the termination always
// precedes, so the command keeps the other half to run).
func fitGrace(a lockArgs, ttl time.Duration, watchdog bool) (time.Duration, error) {
	most := maxGrace(ttl, watchdog)
	what := fmt.Sprintf("--lease %s", ttl)
	if watchdog {
		what = fmt.Sprintf("COORDINATOR_LOCK_WATCHDOG_TIMEOUT=%s (a watchdog lease: termination starts when its renewals are a third of it late)", ttl)
	}
	tooLong := a.grace > most
	if !watchdog {
		tooLong = a.grace >= most // an explicit lease must leave the command time to run
	}
	switch {
	case most <= 0:
		return 0, fmt.Errorf("%s is too short to stop the command before the lock can expire: no --grace fits", what)
	case !a.graceSet && watchdog:
		return min(a.grace, most), nil
	case !a.graceSet:
		return min(a.grace, most/2), nil
	case tooLong:
		return 0, fmt.Errorf("--grace %s does not fit %s: the command must be dead %s before the lease's trust deadline, so --grace must stay below %s (use a longer lease or a shorter grace)",
			a.grace, what, killMargin(ttl), most.Round(time.Millisecond))
	}
	return a.grace, nil
}

// cancelSignals are forwarded to the command once; a second one escalates.
var cancelSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

func runLock(ctx context.Context, cio cliIO, args []string) int {
	a, err := parseLockArgs(args)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator lock: %v\n\n%s\n", err, lockUsage)
		return job.ExitUsage
	}
	cfg, rest, code := loadConfig(cio, "lock", a.rest)
	if code != 0 {
		return code
	}
	if len(rest) > 0 {
		fmt.Fprintf(cio.stderr, "coordinator lock: unexpected arguments %q\n\n%s\n", rest, lockUsage)
		return job.ExitUsage
	}
	if a.waitSet {
		cfg.Lock.WaitTime = a.wait
	}
	ttl, watchdog := a.lease, a.lease == 0
	if watchdog {
		ttl = cfg.Lock.WatchdogTimeout
	}
	grace, err := fitGrace(a, ttl, watchdog)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator lock: %v\n", err)
		return job.ExitUsage
	}
	path, err := exec.LookPath(a.argv[0])
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator lock: %v\n", err)
		return job.ExitUsage
	}
	log := newLogger(cfg, cio.stderr)

	// main leaves signals to this command: the first is forwarded, a second
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

	locker, err := openLocker(ctx, cfg, log, nil)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator lock: %v\n", err)
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
	asked := time.Now()
	lease, err := locker.Acquire(acqCtx, a.key, a.lease)
	close(acquiring)
	watch.Wait()
	switch {
	case err != nil && early != nil:
		// Not "already owned": nobody else is known to have run the work.
		fmt.Fprintf(cio.stderr, "coordinator lock: %s while waiting for the lock; the command did not run\n", early)
		return 128 + int(early.(syscall.Signal))
	case errors.Is(err, ownership.ErrAlreadyOwned):
		fmt.Fprintf(cio.stderr, "coordinator lock: %v\n", err)
		return job.ExitAlreadyOwned
	case err != nil:
		fmt.Fprintf(cio.stderr, "coordinator lock: %v\n", err)
		return job.ExitUnavailable
	}
	log.Info("lock_acquired", "lock_key", a.key, "owner", lease.Owner(), "fence", lease.Fence(), "grace_ms", grace.Milliseconds())

	r := &lockRun{
		log: log, key: a.key, lease: lease, ttl: ttl, watchdog: watchdog, grace: grace,
		sigs: sigs, term: controllingTerminal(cio),
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
	if early != nil {
		_ = r.release(ctx) // logged inside; TTL expiry is the backstop
		return 128 + int(early.(syscall.Signal))
	}
	return r.run(ctx, cio, path, a.argv)
}

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
	rootStop   bool // the command is stopped
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

func (r *lockRun) run(ctx context.Context, cio cliIO, path string, argv []string) int {
	if err := r.lease.Err(); err != nil || (!r.until().IsZero() && !time.Now().Before(r.termAt())) {
		r.log.Error("lock_lost_before_start", "lock_key", r.key, "fence", r.lease.Fence())
		_ = r.release(ctx) // logged inside; TTL expiry is the backstop
		return job.ExitLost
	}
	stdio, err := commandFiles(cio)
	if err != nil {
		_ = r.release(ctx) // logged inside; TTL expiry is the backstop
		fmt.Fprintf(cio.stderr, "coordinator lock: start %s: %v\n", argv[0], err)
		return job.ExitFailed
	}
	cfg := proctree.Config{
		Path: path, Args: argv, Files: stdio.files,
		Env: commandEnv(os.Environ(), r.key, r.lease.Owner(), r.lease.Fence()),
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
		fmt.Fprintf(cio.stderr, "coordinator lock: start %s: %v\n", argv[0], err)
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
	if r.lost || errors.Is(r.lease.Err(), ownership.ErrLeaseLost) {
		_ = r.release(ctx) // logged inside; TTL expiry is the backstop
		return job.ExitLost
	}
	if err := r.release(ctx); errors.Is(err, ownership.ErrNotHeld) {
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

// release gives the lock up, bounded: TTL expiry is the backstop.
func (r *lockRun) release(ctx context.Context) error {
	if r.lease.Err() != nil {
		return r.lease.Err()
	}
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownership.ReleaseTimeout)
	defer cancel()
	err := r.lease.Release(relCtx)
	if err != nil {
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
