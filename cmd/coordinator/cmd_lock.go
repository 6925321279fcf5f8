package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

func init() {
	register(command{name: "lock", summary: "--key K [--lease D] [--wait D] [--grace D] -- CMD ARGS...: run a command holding a lock", run: runLock})
}

const lockUsage = `usage: coordinator lock --key KEY [--lease D] [--wait D] [--grace D] [config flags] -- CMD [ARGS...]

Runs CMD while holding the ownership lock on KEY (a distributed flock).
  --key    lock key (required; 1-200 of A-Z a-z 0-9 . _ : / -)
  --lease  explicit lease (the lock hard-expires after it); default 0 = watchdog-renewed while CMD runs
  --wait   max time to wait for the lock; default COORDINATOR_LOCK_WAIT_TIME
  --grace  on lease loss, time between SIGTERM and SIGKILL of CMD; default 10s
CMD sees COORDINATOR_LOCK_KEY, COORDINATOR_LOCK_OWNER, COORDINATOR_LOCK_FENCE. SIGINT and SIGTERM are
forwarded to CMD's process group. Exit: CMD's own code; 75 already owned; 69 lock backend unavailable;
76 lease lost while CMD ran; 64 bad usage.`

type lockArgs struct {
	key          string
	lease, grace time.Duration
	wait         time.Duration
	waitSet      bool
	rest         []string // configuration flags
	argv         []string
}

// parseLockArgs takes lock's own flags out of args; the others are
// configuration flags for loadConfig. The command follows "--".
func parseLockArgs(args []string) (lockArgs, error) {
	a := lockArgs{grace: 10 * time.Second}
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
			a.grace = d
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
		cfg.LockWaitTime = a.wait
	}
	path, err := exec.LookPath(a.argv[0])
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator lock: %v\n", err)
		return job.ExitUsage
	}
	log := newLogger(cfg, cio.stderr)

	// Our own signal channel: the signal itself is forwarded to CMD.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	locker, err := openLocker(ctx, cfg, log, nil)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator lock: %v\n", err)
		return job.ExitUsage
	}
	defer locker.Close()

	lease, err := locker.Acquire(ctx, a.key, a.lease)
	switch {
	case errors.Is(err, ownership.ErrAlreadyOwned):
		fmt.Fprintf(cio.stderr, "coordinator lock: %v\n", err)
		return job.ExitAlreadyOwned
	case err != nil:
		fmt.Fprintf(cio.stderr, "coordinator lock: %v\n", err)
		return job.ExitUnavailable
	}
	log.Info("lock_acquired", "lock_key", a.key, "owner", lease.Owner(), "fence", lease.Fence())

	cmd := exec.Command(path, a.argv[1:]...)
	cmd.Args[0] = a.argv[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = cio.stdin, cio.stdout, cio.stderr
	cmd.Env = append(os.Environ(),
		"COORDINATOR_LOCK_KEY="+a.key,
		"COORDINATOR_LOCK_OWNER="+lease.Owner(),
		"COORDINATOR_LOCK_FENCE="+strconv.FormatInt(lease.Fence(), 10))
	// Its own process group, so signals reach CMD's children too; and it
	// dies with us (Pdeathsig), so it never runs on without the lock.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownership.ReleaseTimeout)
		_ = lease.Release(relCtx)
		cancel()
		fmt.Fprintf(cio.stderr, "coordinator lock: start %s: %v\n", a.argv[0], err)
		return job.ExitFailed
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	signalGroup := func(s syscall.Signal) { _ = syscall.Kill(-cmd.Process.Pid, s) }

	lost := false
	var kill <-chan time.Time
	done, ctxDone := lease.Done(), ctx.Done()
	var waitErr error
wait:
	for {
		select {
		case waitErr = <-exited:
			break wait
		case <-done:
			done = nil
			lost = true
			log.Error("lock_lost_terminating_command", "lock_key", a.key, "fence", lease.Fence(), "error", lease.Err(), "grace", a.grace)
			signalGroup(syscall.SIGTERM)
			if kill == nil {
				kill = time.After(a.grace)
			}
		case s := <-sigs:
			signalGroup(s.(syscall.Signal))
		case <-ctxDone:
			// Cancelled without a signal of ours (an embedding caller).
			ctxDone = nil
			signalGroup(syscall.SIGTERM)
		case <-kill:
			log.Error("lock_command_killed", "lock_key", a.key, "grace", a.grace)
			signalGroup(syscall.SIGKILL)
		}
	}
	code = exitCode(cmd)
	_ = waitErr // the exit status says it all
	if lost || errors.Is(lease.Err(), ownership.ErrLeaseLost) {
		return job.ExitLost
	}
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownership.ReleaseTimeout)
	defer cancel()
	if err := lease.Release(relCtx); err != nil {
		log.Warn("lock_release_failed", "lock_key", a.key, "fence", lease.Fence(), "error", err)
		if errors.Is(err, ownership.ErrNotHeld) {
			return job.ExitLost
		}
	}
	return code
}

func exitCode(cmd *exec.Cmd) int {
	if cmd.ProcessState == nil {
		return job.ExitFailed
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if code := cmd.ProcessState.ExitCode(); code >= 0 {
		return code
	}
	return job.ExitFailed
}
