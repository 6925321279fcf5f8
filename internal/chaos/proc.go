package chaos

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Mono is CLOCK_MONOTONIC in nanoseconds. Every process on one host reads the
// same clock, so intervals recorded by different processes (the verifier,
// the critical-section helpers) can be compared directly.
func Mono() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// proc is a child process the verifier started and must stop. It dies with
// the verifier (Pdeathsig) and sits in a process group of its own, so a
// terminal's Ctrl-C reaches the verifier only and the verifier stops its
// children in order.
type proc struct {
	name    string
	cmd     *exec.Cmd
	startNS int64
	// startTime is the kernel's start time of the process (/proc/PID/stat
	// field 22): with the PID it names the process even after PID reuse.
	startTime uint64

	done   chan struct{}
	exitNS int64
	state  *os.ProcessState

	mu    sync.Mutex
	tail  tailBuffer
	lines func(string) // called for every output line (may be nil)
}

// procOptions shape startProc.
type procOptions struct {
	// logPath, when set, receives stdout and stderr (appended).
	logPath string
	// lines is called with every line of output, in order.
	lines func(string)
	// deathSig is sent to the child if the verifier dies. Default SIGKILL.
	deathSig syscall.Signal
	// noPgid keeps the child in the verifier's process group.
	noPgid bool
}

func startProc(name string, cmd *exec.Cmd, o procOptions) (*proc, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if o.deathSig != 0 {
		cmd.SysProcAttr.Pdeathsig = o.deathSig
	}
	cmd.SysProcAttr.Setpgid = !o.noPgid
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), lines: o.lines}
	var logFile *os.File
	if o.logPath != "" {
		f, err := os.OpenFile(o.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		logFile = f
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		if logFile != nil {
			logFile.Close()
		}
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		if logFile != nil {
			logFile.Close()
		}
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	pw.Close()
	p.startNS = Mono()
	p.startTime, _ = procStartTime(cmd.Process.Pid)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Text()
			if logFile != nil {
				_, _ = logFile.WriteString(line + "\n")
			}
			p.mu.Lock()
			p.tail.add(line)
			p.mu.Unlock()
			if p.lines != nil {
				p.lines(line)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		_ = cmd.Wait()
		p.exitNS = Mono()
		p.state = cmd.ProcessState
		// Output of a child's own children may keep the pipe open; do not
		// wait for it longer than a moment.
		select {
		case <-copied:
		case <-time.After(2 * time.Second):
		}
		if logFile != nil {
			logFile.Close()
		}
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process by its PID, if it still runs.
func (p *proc) signal(sig syscall.Signal) error {
	if p.exited() {
		return errors.New(p.name + " has exited")
	}
	return p.cmd.Process.Signal(sig)
}

// stop sends sig (and SIGCONT, in case it is stopped), waits up to grace,
// then SIGKILLs and waits. It reports whether the process exited within grace.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) bool {
	inTime, _ := p.stopDumping(sig, grace, 0)
	return inTime
}

// stopDumping is stop for a Go program: one that outlives grace gets
// SIGQUIT first (the runtime writes every goroutine's stack to stderr, the
// log, and exits), up to dumpGrace, so a hung shutdown shows where it hung;
// then SIGKILL. tail is the output's last lines before the dump (nil when
// it exited in time).
func (p *proc) stopDumping(sig syscall.Signal, grace, dumpGrace time.Duration) (inTime bool, tail []string) {
	if p == nil || p.exited() {
		return true, nil
	}
	_ = p.signal(sig)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return true, nil
	case <-t.C:
	}
	tail = p.tailLines(12)
	if dumpGrace > 0 {
		_ = p.signal(syscall.SIGQUIT)
		select {
		case <-p.done:
			return false, tail
		case <-time.After(dumpGrace):
		}
	}
	_ = p.signal(syscall.SIGKILL)
	<-p.done
	return false, tail
}

// exitCode is the exit status, 128+signal when killed by a signal, -1 while running.
func (p *proc) exitCode() int {
	if !p.exited() || p.state == nil {
		return -1
	}
	if ws, ok := p.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return p.state.ExitCode()
}

func (p *proc) tailLines(n int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.tail.last(n)
}

// tailBuffer keeps the last lines of a child's output.
type tailBuffer struct {
	lines []string
	next  int
	full  bool
}

const tailSize = 60

func (t *tailBuffer) add(s string) {
	if len(s) > 2000 {
		s = s[:2000] + "..."
	}
	if t.lines == nil {
		t.lines = make([]string, tailSize)
	}
	t.lines[t.next] = s
	t.next = (t.next + 1) % tailSize
	if t.next == 0 {
		t.full = true
	}
}

func (t *tailBuffer) last(n int) []string {
	var all []string
	if t.full {
		all = append(all, t.lines[t.next:]...)
	}
	all = append(all, t.lines[:t.next]...)
	if len(all) > n {
		all = all[len(all)-n:]
	}
	return all
}

// procStartTime reads field 22 (starttime, clock ticks since boot) of
// /proc/PID/stat.
func procStartTime(pid int) (uint64, error) {
	_, st, err := procStat(pid)
	return st, err
}

// procStat returns the state letter and start time of a process.
func procStat(pid int) (byte, uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// comm (field 2) may hold spaces and parentheses: fields follow the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("bad stat")
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 {
		return 0, 0, errors.New("short stat")
	}
	st, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil || len(fields[0]) == 0 {
		return 0, 0, errors.New("bad stat")
	}
	return fields[0][0], st, nil
}

// aliveProc reports whether the process PID with this start time still runs
// (a zombie does not count: it has exited and waits only to be reaped).
func aliveProc(pid int, startTime uint64) bool {
	state, st, err := procStat(pid)
	if err != nil || st != startTime {
		return false
	}
	return state != 'Z' && state != 'X'
}

// killProc SIGKILLs PID if it is still the process that started at startTime.
func killProc(pid int, startTime uint64) {
	if aliveProc(pid, startTime) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
