package testenv

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/telco-platform/coordinator/internal/localsvc"
)

// PostgresServer is a PostgreSQL server of the test's own (never the shared
// one) on a free loopback port, which the test may stop and start again at
// the same address (outage tests). The postmaster is the test binary's own
// child (localsvc), started directly rather than through pg_ctl (which
// daemonises, so nothing ties the server to the test): it is stopped when
// the test ends, and gets SIGQUIT, Postgres' immediate shutdown, if the test
// binary dies (Pdeathsig), so a killed test run leaves no server behind.
//
// Start, Stop, Kill and Restart must be called from the test's goroutine.
type PostgresServer struct {
	t    testing.TB
	bin  string
	data string
	port int
	proc *localsvc.Process
	// settings are the test's own server settings (name=value), after
	// the defaults: a later -c wins.
	settings []string
}

// StartPostgresServer initialises a throwaway cluster (trust auth, user
// postgres, no fsync) and starts it; it returns once the server accepts
// connections. settings ("name=value") are set after the defaults, e.g.
// "synchronous_commit=off" for a server that loses acknowledged commits at
// an immediate shutdown (Kill). By default it loses none: fsync is off,
// which only matters if the machine crashes, and synchronous_commit is on,
// so a commit is written to the kernel before it is acknowledged.
func StartPostgresServer(t testing.TB, settings ...string) *PostgresServer {
	t.Helper()
	bin := Binary(t, EnvPGBinDir, "/usr/lib/postgresql/15/bin")
	Binary(t, "", filepath.Join(bin, "postgres"))
	// Not t.TempDir: its parent is private to us, and the server may run as
	// another user.
	dir, err := os.MkdirTemp("", "testenv-pg-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	data, err := localsvc.InitPostgres(context.Background(), bin, dir)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	s := &PostgresServer{t: t, bin: bin, data: data, port: freeLoopbackPort(t), settings: settings}
	s.Start()
	t.Cleanup(s.Kill)
	return s
}

// DSN is a URL for the postgres database as user postgres.
func (s *PostgresServer) DSN() string { return localsvc.PostgresDSN(s.port) }

// Port is the server's loopback TCP port.
func (s *PostgresServer) Port() int { return s.port }

// PID is the postmaster's process id (0 while stopped).
func (s *PostgresServer) PID() int {
	if s.proc == nil {
		return 0
	}
	return s.proc.PID()
}

// Start (re)starts the server on its port and waits until it logs that it
// accepts connections. Safe when already running.
func (s *PostgresServer) Start() {
	s.t.Helper()
	if s.proc != nil {
		return
	}
	cmd, err := localsvc.PostgresCommand(s.bin, s.data, s.port, s.settings...)
	if err == nil {
		s.proc, err = localsvc.Start(cmd, localsvc.PostgresReady, time.Minute, nil)
	}
	if err != nil {
		s.t.Fatalf("testenv: postgres on port %d: %v", s.port, err)
	}
}

// Stop shuts the server down the way an operator's restart does (fast
// shutdown: sessions are terminated, then a checkpoint) and waits until it
// has exited. Safe when already stopped.
func (s *PostgresServer) Stop() { s.stop(syscall.SIGINT) }

// Kill stops the server at once (immediate shutdown, no checkpoint) and
// waits until it has exited. Safe when already stopped.
func (s *PostgresServer) Kill() { s.stop(syscall.SIGQUIT) }

// Restart is Stop then Start.
func (s *PostgresServer) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}

func (s *PostgresServer) stop(sig syscall.Signal) {
	if s.proc == nil {
		return
	}
	if err := s.proc.Stop(sig, 30*time.Second); err != nil {
		s.t.Logf("testenv: postgres on port %d: %v", s.port, err)
	}
	s.proc = nil
}
