package demo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/telco-platform/coordinator/internal/localsvc"
)

// ErrMissingBinary marks a program the demo needs that is not installed.
var ErrMissingBinary = localsvc.ErrMissing

// Binaries are the external programs the demo starts.
type Binaries struct {
	RedisServer string // path of redis-server
	PGBinDir    string // directory holding initdb and postgres
}

// FindBinaries resolves redis-server and the PostgreSQL binaries: the given
// paths when set, else PATH, else Debian's locations (localsvc). The error
// is one line saying what to install.
func FindBinaries(redisServer, pgBinDir string) (Binaries, error) {
	var b Binaries
	var errs []string
	var err error
	if b.RedisServer, err = localsvc.RedisServer(redisServer); err != nil {
		if redisServer != "" {
			return b, fmt.Errorf("%w or fix --redis-server", err)
		}
		errs = append(errs, "redis-server")
	}
	if b.PGBinDir, err = localsvc.PostgresBinDir(pgBinDir); err != nil {
		if pgBinDir != "" {
			return b, fmt.Errorf("%w or fix --pg-bin-dir", err)
		}
		errs = append(errs, "postgresql")
	}
	if len(errs) > 0 {
		pkgs := strings.Join(errs, " ")
		return b, fmt.Errorf("%w: the demo needs %s: install with `sudo apt-get install %s` (or run `make demo`, which does), or point --redis-server / --pg-bin-dir at them", ErrMissingBinary, pkgs, pkgs)
	}
	return b, nil
}

// startPostgres initialises a throwaway cluster in dir and starts it on a
// free loopback port (localsvc: no fsync, nothing here is meant to survive).
func startPostgres(ctx context.Context, bin, dir string) (*localsvc.Process, string, error) {
	data, err := localsvc.InitPostgres(ctx, bin, dir)
	if err != nil {
		return nil, "", fmt.Errorf("demo: %w", err)
	}
	port, err := localsvc.FreePort()
	if err != nil {
		return nil, "", err
	}
	cmd, err := localsvc.PostgresCommand(bin, data, port, "synchronous_commit=off", "max_connections=100",
		"shared_buffers=128MB")
	if err != nil {
		return nil, "", fmt.Errorf("demo: %w", err)
	}
	p, err := localsvc.Start(cmd, localsvc.PostgresReady, 30*time.Second, nil)
	if err != nil {
		return nil, "", fmt.Errorf("demo: postgres on 127.0.0.1:%d: %w", port, err)
	}
	return p, localsvc.PostgresDSN(port), nil
}

// startRedis starts a redis-server without persistence on a free loopback port.
func startRedis(bin, dir string) (*localsvc.Process, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	port, err := localsvc.FreePort()
	if err != nil {
		return nil, "", err
	}
	p, err := localsvc.Start(exec.Command(bin, localsvc.RedisArgs(port, dir)...), localsvc.RedisReady, 15*time.Second, nil)
	if err != nil {
		return nil, "", fmt.Errorf("demo: redis-server on 127.0.0.1:%d: %w", port, err)
	}
	return p, fmt.Sprintf("redis://127.0.0.1:%d/0", port), nil
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
