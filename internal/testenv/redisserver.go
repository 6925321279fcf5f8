package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a redis-server of the test's own on a free loopback port,
// which the test may stop and start again at the same address (outage
// tests). The shared services are never touched. The server is killed when
// the test ends, and also if the test binary itself dies (Pdeathsig), so a
// timed-out test run leaves nothing behind.
type RedisServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// StartRedisServer starts a throwaway redis-server and waits until it answers.
func StartRedisServer(t testing.TB) *RedisServer {
	t.Helper()
	s := &RedisServer{t: t, bin: Binary(t, EnvRedisServerBin, "/usr/bin/redis-server"), dir: t.TempDir(), port: freeLoopbackPort(t)}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// freeLoopbackPort returns a loopback port nothing listens on right now.
func freeLoopbackPort(t testing.TB) int {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	return port
}

// Addr is host:port; URL is a redis:// URL for db 0.
func (s *RedisServer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }
func (s *RedisServer) URL() string  { return "redis://" + s.Addr() + "/0" }

// PID is the server's process id (0 while stopped).
func (s *RedisServer) PID() int {
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Start (re)starts the server on its port and waits until it answers.
func (s *RedisServer) Start() {
	s.t.Helper()
	if s.cmd != nil {
		return
	}
	cmd := exec.Command(s.bin, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--daemonize", "no", "--dir", s.dir, "--loglevel", "warning")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("testenv: start redis-server: %v", err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(cmd, s.done)

	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		select {
		case <-s.done:
			s.t.Fatalf("testenv: redis-server on %s exited at start", s.Addr())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("testenv: redis-server on %s did not answer: %v", s.Addr(), err)
		}
		time.Sleep(20 * time.Millisecond) // polling a starting server, bounded by the deadline
	}
}

// Stop SIGKILLs the server (by its PID) and waits until it has exited. Safe
// when already stopped.
func (s *RedisServer) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// Client returns a client on the server, closed when the test ends.
func (s *RedisServer) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
