// Package localsvc starts the throwaway local services that the tests
// (internal/testenv), the demo and the chaos verifier run as children of
// their own process: a redis-server and a PostgreSQL cluster on a loopback
// port, never the shared ones, with nothing worth keeping (no persistence,
// no fsync). What a service needs to start, as which OS user, and how it
// says it is ready is written here once; Start supervises a child the way
// the tests and the demo do (the verifier keeps its own supervision, which
// also times each process for its history).
package localsvc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a server started as this process's child: it dies with its
// parent (Pdeathsig), is stopped by its PID, and its last output lines are
// kept for error messages.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it exited and its output ended
	out  *tail
}

// Start starts cmd so that it dies with this process (Pdeathsig: SIGKILL
// unless cmd asks for another signal) and waits up to within for an output
// line containing ready (compared case-insensitively; "" waits for
// nothing). Its output goes to a pipe read here, not through exec's
// copying goroutine, so that waiting for it never waits on a grandchild
// that holds the pipe; log, when not nil, gets every line too.
func Start(cmd *exec.Cmd, ready string, within time.Duration, log io.Writer) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if cmd.SysProcAttr.Pdeathsig == 0 {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Start()
	_ = w.Close()
	if err != nil {
		_ = r.Close()
		return nil, err
	}
	p := &Process{cmd: cmd, done: make(chan struct{}), out: &tail{marker: strings.ToLower(ready), ready: make(chan struct{}), log: log}}
	if ready == "" {
		p.out.once.Do(func() { close(p.out.ready) })
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer r.Close()
		p.out.scan(r)
	}()
	go func() {
		_ = cmd.Wait()
		<-read
		close(p.done)
	}()
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case <-p.out.ready:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("exited at start (%v): %s", cmd.ProcessState, p.out)
	case <-t.C:
		_ = p.Stop(syscall.SIGKILL, time.Minute) // not ready: killed either way, the error below says why
		return nil, fmt.Errorf("not ready within %s: %s", within, p.out)
	}
}

// PID is the child's process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Signal sends sig to the child by its PID.
func (p *Process) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Done is closed once the child has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Output is the child's last lines of output.
func (p *Process) Output() string { return p.out.String() }

// Stop sends sig (by PID) and waits until the child has exited; after
// grace it is killed, and the error says so.
func (p *Process) Stop(sig syscall.Signal, grace time.Duration) error {
	_ = p.cmd.Process.Signal(sig)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("did not stop within %s of %s: killed: %s", grace, sig, p.out)
}

// tail keeps the last lines a child printed and closes ready at the first
// line containing marker.
type tail struct {
	marker string
	ready  chan struct{}
	log    io.Writer
	once   sync.Once
	mu     sync.Mutex
	lines  []string
}

func (l *tail) scan(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		l.mu.Lock()
		l.lines = append(l.lines, line)
		if len(l.lines) > 20 {
			l.lines = l.lines[len(l.lines)-20:]
		}
		if l.log != nil {
			_, _ = io.WriteString(l.log, line+"\n")
		}
		l.mu.Unlock()
		if l.marker != "" && strings.Contains(strings.ToLower(line), l.marker) {
			l.once.Do(func() { close(l.ready) })
		}
	}
	_, _ = io.Copy(io.Discard, r)
}

func (l *tail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, " | ")
}

// FreePort returns a loopback port nothing listens on right now, for a
// server to bind. It is drawn below the kernel's ephemeral range
// (ip_local_port_range): a port from that range (bound to :0 and closed)
// can be taken by any outgoing connection on the machine before the server
// binds it, which a busy test suite with hundreds of connections does.
// Below the range only servers that choose their own port compete, and a
// bound port is skipped.
func FreePort() (int, error) {
	if lo := ephemeralLow(); lo-portFloor >= 1000 {
		for range 100 {
			port := portFloor + rand.IntN(lo-portFloor)
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				continue // in use
			}
			_ = l.Close()
			return port, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// portFloor is the lowest port FreePort draws: above the fixed ports of
// scripts/services (15432-19095; its cluster bus ports 27001-27006 listen,
// so they are skipped).
const portFloor = 20000

// ephemeralLow is the first port of the kernel's ephemeral range (32768 by
// default), 0 if it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil {
		return 0
	}
	return lo
}

// ErrMissing marks a program that is not installed.
var ErrMissing = errors.New("localsvc: missing program")

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}
