package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// PostgresServer is a PostgreSQL server of the test's own (never the shared
// one) on a free loopback port, which the test may stop and start again at
// the same address (outage tests). The postmaster is the test binary's own
// child, started directly rather than through pg_ctl (which daemonises, so
// nothing ties the server to the test): it is stopped when the test ends,
// and gets SIGQUIT, Postgres' immediate shutdown, if the test binary dies
// (Pdeathsig), so a killed test run leaves no server behind.
//
// Start, Stop, Kill and Restart must be called from the test's goroutine.
type PostgresServer struct {
	t    testing.TB
	bin  string
	dir  string
	data string
	port int
	cred *syscall.Credential // the postgres OS user when we are root
	proc *child
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
	s := &PostgresServer{t: t, bin: bin, settings: settings}
	if os.Geteuid() == 0 { // Postgres refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("testenv: a postgres OS user is needed to run a throwaway server as root: %v", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// Not t.TempDir: its parent is private to us, and the server may run as
	// another user.
	dir, err := os.MkdirTemp("", "testenv-pg-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	s.dir, s.data, s.port = dir, filepath.Join(dir, "data"), freeLoopbackPort(t)

	initdb := s.command("initdb", "-D", s.data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
		"--locale=C", "--no-sync", "--no-instructions")
	initdb.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("testenv: initdb: %v: %s", err, out)
	}
	s.Start()
	t.Cleanup(s.Kill)
	return s
}

// command runs a Postgres program as the server's OS user.
func (s *PostgresServer) command(prog string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, prog), args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	return cmd
}

// DSN is a URL for the postgres database as user postgres.
func (s *PostgresServer) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Port is the server's loopback TCP port.
func (s *PostgresServer) Port() int { return s.port }

// PID is the postmaster's process id (0 while stopped).
func (s *PostgresServer) PID() int {
	if s.proc == nil {
		return 0
	}
	return s.proc.pid()
}

// Start (re)starts the server on its port and waits until it logs that it
// accepts connections. Safe when already running.
func (s *PostgresServer) Start() {
	s.t.Helper()
	if s.proc != nil {
		return
	}
	args := []string{"-D", s.data, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "lc_messages=C", "-c", "logging_collector=off"}
	for _, kv := range s.settings {
		args = append(args, "-c", kv)
	}
	cmd := s.command("postgres", args...)
	// If we die: the postmaster's immediate shutdown, which takes its
	// backends down with it and removes its shared memory.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	p, err := startChild(cmd, "database system is ready to accept connections", time.Minute)
	if err != nil {
		s.t.Fatalf("testenv: postgres on port %d: %v", s.port, err)
	}
	s.proc = p
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
	if err := s.proc.stop(sig, 30*time.Second); err != nil {
		s.t.Logf("testenv: postgres on port %d: %v", s.port, err)
	}
	s.proc = nil
}
