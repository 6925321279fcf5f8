package redislock_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/testenv"
)

// throwaway is a redis-server of the test's own on a free loopback port,
// which the test may kill and restart. Never the shared services.
type throwaway struct {
	t    testing.TB
	bin  string
	port int
	cmd  *exec.Cmd
	dir  string
}

func startThrowaway(t testing.TB) *throwaway {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	s := &throwaway{t: t, bin: testenv.Binary(t, testenv.EnvRedisServerBin, "/usr/bin/redis-server"), port: port, dir: t.TempDir()}
	s.start()
	t.Cleanup(s.kill)
	return s
}

func (s *throwaway) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", s.port) }

func (s *throwaway) start() {
	s.t.Helper()
	s.cmd = exec.Command(s.bin, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--protected-mode", "no", "--loglevel", "warning")
	require.NoError(s.t, s.cmd.Start())
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", s.port), DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("throwaway redis-server on %d did not answer: %v", s.port, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a starting server, bounded by the deadline
	}
}

// kill SIGKILLs the server this test started (by its PID) and reaps it.
func (s *throwaway) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	_ = s.cmd.Wait()
	s.cmd = nil
}

func (s *throwaway) client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", s.port)})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
