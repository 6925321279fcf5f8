package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telco-platform/coordinator/internal/postgres"
)

// ErrMissingBinary marks a program the demo needs that is not installed.
var ErrMissingBinary = errors.New("demo: missing program")

// Binaries are the external programs the demo starts.
type Binaries struct {
	RedisServer string // path of redis-server
	PGBinDir    string // directory holding initdb and postgres
}

// FindBinaries resolves redis-server and the PostgreSQL binaries: the given
// paths when set, else PATH, else Debian's locations. The error is one line
// saying what to install.
func FindBinaries(redisServer, pgBinDir string) (Binaries, error) {
	var b Binaries
	var missing []string
	switch {
	case redisServer != "":
		if !executable(redisServer) {
			return b, fmt.Errorf("%w: redis-server not found at %s: install it (apt-get install redis-server, or `scripts/services install redis`) or fix --redis-server", ErrMissingBinary, redisServer)
		}
		b.RedisServer = redisServer
	default:
		if p, err := exec.LookPath("redis-server"); err == nil {
			b.RedisServer = p
		} else if executable("/usr/bin/redis-server") {
			b.RedisServer = "/usr/bin/redis-server"
		} else {
			missing = append(missing, "redis-server")
		}
	}
	switch {
	case pgBinDir != "":
		if !executable(filepath.Join(pgBinDir, "initdb")) || !executable(filepath.Join(pgBinDir, "postgres")) {
			return b, fmt.Errorf("%w: initdb and postgres not found in %s: install PostgreSQL (apt-get install postgresql, or `scripts/services install postgres`) or fix --pg-bin-dir", ErrMissingBinary, pgBinDir)
		}
		b.PGBinDir = pgBinDir
	default:
		if dir := debianPGBinDir(); dir != "" {
			b.PGBinDir = dir
		} else if p, err := exec.LookPath("initdb"); err == nil && executable(filepath.Join(filepath.Dir(p), "postgres")) {
			b.PGBinDir = filepath.Dir(p)
		} else {
			missing = append(missing, "postgresql")
		}
	}
	if len(missing) > 0 {
		pkgs := ""
		for i, m := range missing {
			if i > 0 {
				pkgs += " "
			}
			pkgs += m
		}
		return b, fmt.Errorf("%w: the demo needs %s: install with `sudo apt-get install %s` (or run `make demo`, which does), or point --redis-server / --pg-bin-dir at them", ErrMissingBinary, pkgs, pkgs)
	}
	return b, nil
}

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// debianPGBinDir returns the newest /usr/lib/postgresql/N/bin with initdb.
func debianPGBinDir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if executable(filepath.Join(d, "initdb")) && executable(filepath.Join(d, "postgres")) {
			return d
		}
	}
	return ""
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// proc is a child process the demo started and must stop.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProc(name string, cmd *exec.Cmd) (*proc, error) {
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("demo: start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends sig to the process (by its PID), waits up to grace, then kills it.
func (p *proc) stop(sig os.Signal, grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return
	case <-t.C:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// asPostgresUser makes cmd run as the postgres OS user when we are root
// (PostgreSQL refuses to run as root).
func asPostgresUser(cmd *exec.Cmd) error {
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("%w: running as root needs the postgres OS user, which the postgresql package creates: install it (apt-get install postgresql) or run the demo as a normal user", ErrMissingBinary)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	cmd.Dir = "/"
	return nil
}

// dieWithParent asks the kernel to send sig to the child if the demo dies
// without stopping it (SIGKILL, a crash), so nothing keeps running.
func dieWithParent(cmd *exec.Cmd, sig syscall.Signal) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = sig
}

func chownToPostgres(path string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil // asPostgresUser reports it
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(path, uid, gid)
}

// startPostgres initialises a throwaway cluster in dir and starts it on a
// free loopback port (no fsync: nothing here is meant to survive).
func startPostgres(ctx context.Context, bin, dir string) (*proc, string, error) {
	data := filepath.Join(dir, "pgdata")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	if err := chownToPostgres(dir); err != nil {
		return nil, "", fmt.Errorf("demo: %w", err)
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C.UTF-8", "--no-sync", "--no-instructions")
	if err := asPostgresUser(initdb); err != nil {
		return nil, "", err
	}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("demo: initdb: %w: %s", err, lastLines(out, 5))
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	logBuf := &syncBuffer{}
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=100", "-c", "shared_buffers=128MB", "-c", "log_min_messages=warning")
	cmd.Stdout, cmd.Stderr = logBuf, logBuf
	dieWithParent(cmd, syscall.SIGQUIT) // the postmaster's immediate shutdown
	if err := asPostgresUser(cmd); err != nil {
		return nil, "", err
	}
	p, err := startProc("postgres", cmd)
	if err != nil {
		return nil, "", err
	}
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		pool, err := postgres.Connect(cctx, dsn, 1)
		cancel()
		if err == nil {
			pool.Close()
			return p, dsn, nil
		}
		if p.exited() || time.Now().After(deadline) || ctx.Err() != nil {
			p.stop(os.Interrupt, 5*time.Second)
			return nil, "", fmt.Errorf("demo: postgres did not start on 127.0.0.1:%d: %v: %s", port, err, lastLines(logBuf.Bytes(), 5))
		}
		pause(ctx, 100*time.Millisecond)
	}
}

// startRedis starts a redis-server without persistence on a free loopback port.
func startRedis(ctx context.Context, bin, dir string) (*proc, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	logBuf := &syncBuffer{}
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no",
		"--dir", dir, "--daemonize", "no", "--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = logBuf, logBuf
	dieWithParent(cmd, syscall.SIGKILL)
	p, err := startProc("redis-server", cmd)
	if err != nil {
		return nil, "", err
	}
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return p, url, nil
		}
		if p.exited() || time.Now().After(deadline) || ctx.Err() != nil {
			p.stop(os.Interrupt, 5*time.Second)
			return nil, "", fmt.Errorf("demo: redis-server did not answer on 127.0.0.1:%d: %v: %s", port, err, lastLines(logBuf.Bytes(), 5))
		}
		pause(ctx, 50*time.Millisecond)
	}
}

// pause waits d or until ctx ends (a bounded poll interval, not a wait for a state).
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func lastLines(b []byte, n int) string {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte(" | ")))
}

// syncBuffer collects a child's output; exec copies stdout and stderr from
// two goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf.Bytes()...)
}
