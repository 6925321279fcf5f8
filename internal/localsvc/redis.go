package localsvc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// RedisReady is the line a redis-server logs (at --loglevel notice) once it
// accepts connections.
const RedisReady = "ready to accept connections"

// RedisArgs are a throwaway redis-server's: listening on 127.0.0.1:port,
// without persistence (a restart comes back empty), in the foreground,
// its working files in dir, logging at notice (RedisReady); extra may add
// or override options ("--replicaof", "127.0.0.1", "6380").
func RedisArgs(port int, dir string, extra ...string) []string {
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--dir", dir, "--loglevel", "notice"}
	return append(args, extra...)
}

// SentinelArgs are the arguments of a Sentinel (redis-server
// sentinel.conf --sentinel) on 127.0.0.1:port with conf's lines (sentinel
// monitor ..., ...). sentinel.conf is written in dir at the first start
// only: Sentinel rewrites it with what it learns, and a restart reads that.
// Sentinel logs "sentinel id is" once it listens.
func SentinelArgs(port int, dir string, conf ...string) ([]string, error) {
	path := filepath.Join(dir, "sentinel.conf")
	if _, err := os.Stat(path); err != nil {
		lines := append([]string{"port " + strconv.Itoa(port), "bind 127.0.0.1", "dir " + dir, "loglevel notice"}, conf...)
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	return []string{path, "--sentinel"}, nil
}

// SentinelReady is the line a Sentinel logs once it listens (and says
// nothing later).
const SentinelReady = "sentinel id is"

// RedisServer is the redis-server binary: path when set (it must exist),
// else redis-server on PATH, else Debian's /usr/bin/redis-server. The
// error, matching ErrMissing, says what to install.
func RedisServer(path string) (string, error) {
	if path != "" {
		if !executable(path) {
			return "", missing("redis-server not found at " + path + ": install it (apt-get install redis-server, or `scripts/services install redis`)")
		}
		return path, nil
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	if executable("/usr/bin/redis-server") {
		return "/usr/bin/redis-server", nil
	}
	return "", missing("redis-server not found: install it (apt-get install redis-server, or `scripts/services install redis`)")
}
