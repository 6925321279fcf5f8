package testenv

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// child is a server the test binary started as its own child process.
type child struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it exited and its output ended
	out  *tail
}

// startChild starts cmd so that it dies with the test binary (Pdeathsig;
// SIGKILL unless cmd asks for another signal) and waits for the line that
// says it is ready: a line containing ready (compared case-insensitively).
// Its output goes to a pipe read here, not through exec's copying
// goroutine, so that waiting for it never waits on a grandchild that holds
// the pipe.
func startChild(cmd *exec.Cmd, ready string, within time.Duration) (*child, error) {
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
	c := &child{cmd: cmd, done: make(chan struct{}), out: &tail{marker: strings.ToLower(ready), ready: make(chan struct{})}}
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer r.Close()
		c.out.scan(r)
	}()
	go func() {
		_ = cmd.Wait()
		<-read
		close(c.done)
	}()
	select {
	case <-c.out.ready:
		return c, nil
	case <-c.done:
		return nil, fmt.Errorf("exited at start (%v): %s", cmd.ProcessState, c.out)
	case <-time.After(within):
		_ = c.stop(syscall.SIGKILL, time.Minute) // not ready: killed either way, the error below says why
		return nil, fmt.Errorf("not ready within %s: %s", within, c.out)
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// stop sends sig (by PID) and waits until the child has exited; after
// grace it is killed.
func (c *child) stop(sig syscall.Signal, grace time.Duration) error {
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
		return nil
	case <-time.After(grace):
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
	return fmt.Errorf("did not stop within %s of %s: killed: %s", grace, sig, c.out)
}

// tail keeps the last lines a child printed and closes ready at the first
// line containing marker.
type tail struct {
	marker string
	ready  chan struct{}
	once   sync.Once
	mu     sync.Mutex
	lines  []string
}

func (l *tail) scan(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		l.mu.Lock()
		l.lines = append(l.lines, line)
		if len(l.lines) > 20 {
			l.lines = l.lines[len(l.lines)-20:]
		}
		l.mu.Unlock()
		if strings.Contains(strings.ToLower(line), l.marker) {
			l.once.Do(func() { close(l.ready) })
		}
	}
}

func (l *tail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, " | ")
}

// freeLoopbackPort returns a loopback port nothing listens on right now,
// for a server a test starts. It is drawn below the kernel's ephemeral range
// (ip_local_port_range): a port from that range (bound to :0 and closed)
// can be taken by any outgoing connection on the machine before the server
// binds it, which a busy suite with hundreds of connections does. Below the
// range only servers that choose their own port compete, and a bound port is
// skipped.
func freeLoopbackPort(t testing.TB) int {
	t.Helper()
	if lo := ephemeralLow(); lo-serverPortFloor >= 1000 {
		for range 100 {
			port := serverPortFloor + rand.IntN(lo-serverPortFloor)
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				continue // in use
			}
			_ = l.Close()
			return port
		}
	}
	port, err := freePort()
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	return port
}

// serverPortFloor is the lowest port freeLoopbackPort draws: above the fixed
// ports of scripts/services (15432-19095; its cluster bus ports 27001-27006
// listen, so they are skipped).
const serverPortFloor = 20000

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
