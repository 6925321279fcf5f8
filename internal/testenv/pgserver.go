package testenv

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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
type PostgresServer struct {
	t    testing.TB
	bin  string
	dir  string
	data string
	port int
	cred *syscall.Credential // the postgres OS user when we are root

	cmd  *exec.Cmd
	done chan struct{} // closed when the postmaster exited and its output ended
	out  *tail
}

// StartPostgresServer initialises a throwaway cluster (trust auth, user
// postgres, no fsync) and starts it; it returns once the server accepts
// connections.
func StartPostgresServer(t testing.TB) *PostgresServer {
	t.Helper()
	bin := Binary(t, EnvPGBinDir, "/usr/lib/postgresql/15/bin")
	Binary(t, "", filepath.Join(bin, "postgres"))
	s := &PostgresServer{t: t, bin: bin}
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
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("testenv: initdb: %v: %s", err, out)
	}
	s.Start()
	t.Cleanup(s.Kill)
	return s
}

// command runs a Postgres program as the server's OS user, dying with the
// test binary.
func (s *PostgresServer) command(prog string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, prog), args...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGKILL}
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
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Start (re)starts the server on its port and waits until it logs that it
// accepts connections. Safe when already running.
func (s *PostgresServer) Start() {
	s.t.Helper()
	if s.cmd != nil {
		return
	}
	cmd := s.command("postgres", "-D", s.data, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "lc_messages=C", "-c", "logging_collector=off")
	// The postmaster's immediate shutdown if we die: it takes its backends
	// down with it and removes its shared memory.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
	// Its output goes to a pipe we read ourselves (not cmd's copying
	// goroutine), so Wait never waits on a backend that holds it.
	r, w, err := os.Pipe()
	if err != nil {
		s.t.Fatalf("testenv: %v", err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Start()
	_ = w.Close()
	if err != nil {
		_ = r.Close()
		s.t.Fatalf("testenv: start postgres: %v", err)
	}
	out := &tail{ready: make(chan struct{})}
	done := make(chan struct{})
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer r.Close()
		out.scan(r, "database system is ready to accept connections")
	}()
	go func() {
		_ = cmd.Wait()
		<-read
		close(done)
	}()
	s.cmd, s.done, s.out = cmd, done, out

	select {
	case <-out.ready:
	case <-done:
		s.cmd = nil
		s.t.Fatalf("testenv: postgres on port %d exited at start: %s", s.port, out.String())
	case <-time.After(60 * time.Second):
		s.Kill()
		s.t.Fatalf("testenv: postgres on port %d not ready within 60s: %s", s.port, out.String())
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
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		s.t.Logf("testenv: postgres did not stop within 30s of %s; killing it: %s", sig, s.out.String())
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.done
	}
	s.cmd = nil
}

// tail keeps the last lines a server printed and closes ready when a line
// contains the marker.
type tail struct {
	ready chan struct{}
	once  sync.Once
	mu    sync.Mutex
	lines []string
}

func (l *tail) scan(r *os.File, marker string) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		l.mu.Lock()
		l.lines = append(l.lines, line)
		if len(l.lines) > 20 {
			l.lines = l.lines[len(l.lines)-20:]
		}
		l.mu.Unlock()
		if strings.Contains(line, marker) {
			l.once.Do(func() { close(l.ready) })
		}
	}
}

func (l *tail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, " | ")
}
