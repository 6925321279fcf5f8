package testenv

import (
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
// killed or timed-out test run leaves nothing behind.
//
// Start and Stop must be called from the test's goroutine.
type RedisServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	proc *child
}

// StartRedisServer starts a throwaway redis-server and waits until it
// accepts connections.
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
	if s.proc == nil {
		return 0
	}
	return s.proc.pid()
}

// Start (re)starts the server on its port and waits until it logs that it
// accepts connections. Safe when already running.
func (s *RedisServer) Start() {
	s.t.Helper()
	if s.proc != nil {
		return
	}
	cmd := exec.Command(s.bin, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--daemonize", "no", "--dir", s.dir, "--loglevel", "notice")
	p, err := startChild(cmd, "ready to accept connections", time.Minute)
	if err != nil {
		s.t.Fatalf("testenv: redis-server on %s: %v", s.Addr(), err)
	}
	s.proc = p
}

// Stop SIGKILLs the server (by its PID) and waits until it has exited. Safe
// when already stopped.
func (s *RedisServer) Stop() {
	if s.proc == nil {
		return
	}
	_ = s.proc.stop(syscall.SIGKILL, time.Minute)
	s.proc = nil
}

// Client returns a client on the server, closed when the test ends.
func (s *RedisServer) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
