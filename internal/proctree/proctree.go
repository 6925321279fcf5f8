// Package proctree runs a command as the root of a process tree that the
// calling process owns down to the last descendant.
//
// The calling process becomes a child subreaper (prctl
// PR_SET_CHILD_SUBREAPER): a descendant whose parent dies is re-parented to
// it instead of to init, so a process that left the command's process group
// or session (setsid, a double fork) is still a descendant. Signal reaches
// every live descendant, Kill repeats SIGKILL until none is left, and the
// Empty event says that the command and every descendant have been reaped.
//
// Rules for the caller: one Tree per process at a time, and no other child
// processes while it runs: the reaper waits for any child (wait4(-1)), as
// init does, because a re-parented orphan can be any pid.
//
// What it cannot do: if the calling process itself is killed with SIGKILL,
// only the command (the root) dies with it (Pdeathsig); its descendants are
// re-parented to the next subreaper or init and run on. A cgroup is the only
// container that survives its supervisor; this package does not use one.
package proctree

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Config describes the command to start.
type Config struct {
	// Path is the executable; Args[0] is the name the command sees.
	Path string
	Args []string
	Env  []string
	// Files become the command's descriptors 0, 1, 2, ...
	Files []*os.File
	// TTY, when set, is the terminal whose foreground process group the
	// command's new group becomes (the caller must be in that terminal's
	// foreground group). Nil: the command's group stays in the background.
	TTY *os.File
}

// Kind says what an Event reports.
type Kind int

const (
	// RootExited: the command itself exited or was killed; Status says how.
	// Its descendants may still run.
	RootExited Kind = iota + 1
	// RootStopped: the command was stopped (Status.StopSignal()).
	RootStopped
	// RootContinued: the command was continued.
	RootContinued
	// Empty: the command and every descendant have been reaped. It is the
	// last event; the channel is closed after it.
	Empty
)

func (k Kind) String() string {
	switch k {
	case RootExited:
		return "root_exited"
	case RootStopped:
		return "root_stopped"
	case RootContinued:
		return "root_continued"
	case Empty:
		return "empty"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Event is a change of the tree's state.
type Event struct {
	Kind   Kind
	Status syscall.WaitStatus
}

// Tree is a running command and everything it started.
type Tree struct {
	self   int
	pid    int
	events chan Event
	// kill is closed by Kill: from then on the reaper sends SIGKILL to the
	// whole tree after every reaping and on a short tick, until it is empty.
	kill     chan struct{}
	killOnce sync.Once

	// mu orders reaping the root against signalling its process group, so
	// that a group id is never signalled after it may have been reused.
	mu         sync.Mutex
	rootReaped bool
}

// ErrRootGone is returned by SignalGroup once the command has been reaped.
var ErrRootGone = errors.New("proctree: the command has exited")

// Start makes the calling process a child subreaper and starts the command
// in a process group of its own (the root's pid is the group id), with
// SIGKILL as its parent-death signal.
func Start(cfg Config) (*Tree, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("proctree: become a child subreaper: %w", err)
	}
	t := &Tree{self: os.Getpid(), events: make(chan Event, 8), kill: make(chan struct{})}
	// Notified before the fork, so no SIGCHLD is missed.
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, syscall.SIGCHLD)
	started := make(chan error, 1)
	go t.run(cfg, sigchld, started)
	if err := <-started; err != nil {
		signal.Stop(sigchld)
		return nil, err
	}
	return t, nil
}

// run forks the command and then reaps until no child is left. It stays on
// the thread that forked: the kernel sends Pdeathsig when that thread (not
// the process) exits, and Go ends a thread when a goroutine that locked it
// returns, so this goroutine keeps the thread alive and locked for as long
// as the command may live.
func (t *Tree) run(cfg Config, sigchld chan os.Signal, started chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer signal.Stop(sigchld)

	sys := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if cfg.TTY != nil {
		sys.Foreground = true // the child sets itself as foreground before exec, signals blocked
		sys.Ctty = int(cfg.TTY.Fd())
	}
	p, err := os.StartProcess(cfg.Path, cfg.Args, &os.ProcAttr{Env: cfg.Env, Files: cfg.Files, Sys: sys})
	if err != nil {
		started <- err
		return
	}
	// The pid is reaped below with wait4, never through p.
	defer func() { _ = p.Release() }()
	t.pid = p.Pid
	started <- nil
	var tick <-chan time.Time
	kill := t.kill
	for !t.reap() {
		if tick != nil {
			// A process forked just before its SIGKILL was not in the last
			// round; it shows up once re-parented to us.
			t.Signal(syscall.SIGKILL)
		}
		select {
		case <-sigchld:
		case <-kill:
			kill = nil
			ticker := time.NewTicker(killRound)
			defer ticker.Stop()
			tick = ticker.C
		case <-tick:
		}
	}
	t.events <- Event{Kind: Empty}
	close(t.events)
}

// killRound bounds how long a descendant forked during a SIGKILL round can
// live on unseen, when nothing else tells the reaper to look again.
const killRound = 50 * time.Millisecond

// Kill sends SIGKILL to every descendant now and keeps doing so until the
// tree is empty (the Empty event). Safe to call more than once.
func (t *Tree) Kill() {
	t.Signal(syscall.SIGKILL)
	t.killOnce.Do(func() { close(t.kill) })
}

// reap collects every child whose state changed and reports whether no child
// is left at all. A subreaper with no children has no descendants either.
func (t *Tree) reap() (empty bool) {
	for {
		var ws unix.WaitStatus
		t.mu.Lock()
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG|unix.WUNTRACED|unix.WCONTINUED, nil)
		isRoot := err == nil && pid == t.pid
		if isRoot && (ws.Exited() || ws.Signaled()) {
			t.rootReaped = true
		}
		t.mu.Unlock()
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ECHILD):
			return true
		case err != nil || pid == 0:
			return false // nothing more now; the next SIGCHLD brings us back
		}
		st := syscall.WaitStatus(ws)
		switch {
		case isRoot && (ws.Exited() || ws.Signaled()):
			t.events <- Event{Kind: RootExited, Status: st}
		case isRoot && ws.Stopped():
			t.events <- Event{Kind: RootStopped, Status: st}
		case isRoot && ws.Continued():
			t.events <- Event{Kind: RootContinued, Status: st}
		}
	}
}

// ContinueStopped sends SIGCONT to every descendant that is stopped, so that
// a SIGTERM sent to it can be handled; running ones are left alone.
func (t *Tree) ContinueStopped() {
	for _, pid := range liveDescendants(t.self) {
		if st, ok := readStat(pid); ok && (st.state == 'T' || st.state == 't') {
			signalPid(t.self, pid, syscall.SIGCONT)
		}
	}
}

// Pid is the command's pid, which is also its process group id.
func (t *Tree) Pid() int { return t.pid }

// Events delivers the tree's state changes; Empty is the last.
func (t *Tree) Events() <-chan Event { return t.events }

// SignalGroup sends sig to the command's process group, as a terminal does.
// It returns ErrRootGone once the command has been reaped: its group id may
// then be reused, so use Signal.
func (t *Tree) SignalGroup(sig syscall.Signal) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rootReaped {
		return ErrRootGone
	}
	err := syscall.Kill(-t.pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil // the root left its own group; Signal still finds it
	}
	return err
}

// Signal sends sig once to every live descendant, whatever its process
// group or session, and returns how many it reached.
func (t *Tree) Signal(sig syscall.Signal) int {
	n := 0
	for _, pid := range liveDescendants(t.self) {
		if signalPid(t.self, pid, sig) {
			n++
		}
	}
	return n
}
