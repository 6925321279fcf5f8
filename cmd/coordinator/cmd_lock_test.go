package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/lockrun"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

type lockCLIEnv struct {
	redis *testenv.RedisEnv
	vars  map[string]string
}

func newLockCLIEnv(t *testing.T) *lockCLIEnv {
	t.Helper()
	r := testenv.Redis(t)
	return &lockCLIEnv{redis: r, vars: map[string]string{
		"COORDINATOR_LOCK_REDIS_URL":        r.URL,
		"COORDINATOR_LOCK_KEY_PREFIX":       r.Prefix,
		"COORDINATOR_REPLICA_ID":            "cli-test",
		"COORDINATOR_LOCK_WATCHDOG_TIMEOUT": "30s",
		"COORDINATOR_LOG_LEVEL":             "warn",
	}}
}

func (e *lockCLIEnv) lockKey(key string) string { return e.redis.Prefix + ":{" + key + "}:lock" }

// holder takes key with a Locker of the test's own.
func (e *lockCLIEnv) holder(t *testing.T, key string) ownership.Lease {
	t.Helper()
	c, err := redislock.NewClient(e.redis.URL, redislock.ModeSingle)
	require.NoError(t, err)
	l, err := redislock.New(c, redislock.Config{Prefix: e.redis.Prefix, Owner: "other-replica", WatchdogTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(); _ = c.Close() })
	le, err := l.Acquire(context.Background(), key, 0)
	require.NoError(t, err)
	return le
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type cliRun struct {
	code           int
	stdout, stderr string
}

// startCLI runs the command in the background; the result arrives on the channel.
func startCLI(ctx context.Context, env map[string]string, args ...string) <-chan cliRun {
	done := make(chan cliRun, 1)
	go func() {
		// The command's output and our log lines both go to stderr.
		var out, errb lockedBuffer
		cio := cliIO{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(k string) string { return env[k] }}
		code := dispatch(ctx, cio, args)
		done <- cliRun{code, out.String(), errb.String()}
	}()
	return done
}

// lockCLI is runCLI with buffers safe for the command's and our writes.
func lockCLI(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	r := <-startCLI(context.Background(), env, args...)
	return r.code, r.stdout, r.stderr
}

// with returns a copy of the environment with kv pairs added or replaced.
func (e *lockCLIEnv) with(kv ...string) map[string]string {
	m := make(map[string]string, len(e.vars)+len(kv)/2)
	for k, v := range e.vars {
		m[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func (e *lockCLIEnv) exists(t *testing.T, key string) bool {
	t.Helper()
	n, err := e.redis.Client.Exists(context.Background(), e.lockKey(key)).Result()
	require.NoError(t, err)
	return n == 1
}

// signalLines returns the "role SIGNAL" lines a tree helper recorded.
func signalLines(path string) []string {
	b, _ := os.ReadFile(path)
	s := strings.TrimSpace(string(b))
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// waitSignal waits until the helper recorded line.
func waitSignal(t *testing.T, path, line string) {
	t.Helper()
	require.Eventually(t, func() bool { return slices.Contains(signalLines(path), line) },
		20*time.Second, 10*time.Millisecond, "the command never got %q; it got %q", line, signalLines(path))
}

func TestLockRunsCommandWithLockEnv(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	code, out, errs := startLock(t, e.vars, "--key", "cli/env", "--",
		"sh", "-c", `echo "$COORDINATOR_LOCK_KEY $COORDINATOR_LOCK_OWNER $COORDINATOR_LOCK_FENCE"; exit 7`).wait(30 * time.Second)
	require.Equal(t, 7, code, "the command's own exit code: %s", errs)
	fields := strings.Fields(out)
	require.Len(t, fields, 3, out)
	require.Equal(t, "cli/env", fields[0])
	require.Equal(t, "cli-test", fields[1])
	fence, err := strconv.ParseInt(fields[2], 10, 64)
	require.NoError(t, err)
	require.Positive(t, fence)
	require.False(t, e.exists(t, "cli/env"), "the lock is released when the command ends")

	code, out, errs = startLock(t, e.vars, "--key=cli/env", "--lease", "5s", "--", "sh", "-c", `echo $COORDINATOR_LOCK_FENCE`).wait(30 * time.Second)
	require.Equal(t, 0, code, errs)
	next, _ := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	require.Greater(t, next, fence)
}

func TestLockExitCodes(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	e.holder(t, "cli/held")
	code, _, errs := lockCLI(t, e.vars, "lock", "--key", "cli/held", "--wait", "100ms", "--", "true")
	require.Equal(t, job.ExitAlreadyOwned, code, errs)
	require.Contains(t, errs, "other-replica")
	require.Contains(t, errs, ownership.CodeLockAcquisitionFailed)

	down := map[string]string{"COORDINATOR_LOCK_REDIS_URL": "redis://127.0.0.1:1/0", "COORDINATOR_LOG_LEVEL": "error"}
	code, out, errs := lockCLI(t, down, "lock", "--key", "cli/down", "--wait", "1s", "--", "echo", "ran")
	require.Equal(t, job.ExitUnavailable, code, errs)
	require.NotContains(t, out, "ran", "the command must not run without the lock")

	for _, args := range [][]string{
		{"lock", "--", "true"},
		{"lock", "--key", "k"},
		{"lock", "--key", "k", "--"},
		{"lock", "--key", "bad key", "--", "true"},
		{"lock", "--key", "k", "--lease", "soon", "--", "true"},
		{"lock", "--key", "k", "--", "/no/such/command"},
		{"lock", "--key", "k", "--lock-wait-time", "banana", "--", "true"},
	} {
		code, _, errs := lockCLI(t, e.vars, args...)
		require.Equal(t, job.ExitUsage, code, "%q: %s", args, errs)
	}
}

// A grace that cannot end before the lease could expire is refused up
// front: nothing is locked and nothing runs.
func TestLockRefusesAGraceThatCannotFit(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	marker := filepath.Join(t.TempDir(), "ran")
	for _, c := range []struct {
		name    string
		vars    map[string]string
		args    []string
		mention string
	}{
		{"explicit lease", e.vars, []string{"--lease", "2s", "--grace", "5s"}, "--lease 2s"},
		{"watchdog lease", e.with("COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "3s"), []string{"--grace", "5s"}, "COORDINATOR_LOCK_WATCHDOG_TIMEOUT"},
		{"lease too short for any termination", e.vars, []string{"--lease", "1ms"}, "--lease 1ms"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append(append([]string{"lock", "--key", "cli/nofit"}, c.args...), "--", "touch", marker)
			code, _, errs := lockCLI(t, c.vars, args...)
			require.Equal(t, job.ExitUsage, code, errs)
			require.Contains(t, errs, "--grace")
			require.Contains(t, errs, c.mention)
			require.NoFileExists(t, marker, "the command must not run")
			require.False(t, e.exists(t, "cli/nofit"), "nothing was locked")
		})
	}
}

// The command leaves a process behind that escaped its group and session
// (setsid and a double fork) and keeps the command's output open. The lock
// is released only after that process is dead: the next holder's command
// finds the flock the whole first tree held free.
func TestLockKillsWhatTheCommandLeftBehindBeforeRelease(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		extra []string
	}{
		{"leftover exits on SIGTERM", nil},
		{"leftover ignores SIGTERM", []string{"-ignore-term"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newLockCLIEnv(t)
			dir := t.TempDir()
			flockFile, ready, sigs := filepath.Join(dir, "flock"), filepath.Join(dir, "ready"), filepath.Join(dir, "signals")
			noOrphans(t, ready)
			args := append([]string{"tree", "-flock", flockFile, "-ready", ready, "-signals", sigs, "-escape", "-exit"}, c.extra...)
			first := startLock(t, e.vars, append([]string{"--key", "cli/leftover", "--grace", "1s", "--"}, helperArgv(t, args[0], args[1:]...)...)...)
			pids := treePids(t, ready)
			require.Contains(t, pids, "leaf")

			second := startLock(t, e.vars, append([]string{"--key", "cli/leftover", "--wait", "60s", "--"}, helperArgv(t, "checkfree", flockFile)...)...)
			code, _, errs := first.wait(30 * time.Second)
			require.Equal(t, 0, code, "the command's own code: %s", errs)
			require.False(t, alive(t, pids["leaf"]), "the escaped leaf is dead when lock returns")
			require.Equal(t, []string{"leaf SIGTERM"}, signalLines(sigs), "the leftover got SIGTERM first, once")

			code, out, errs := second.wait(60 * time.Second)
			require.Equal(t, 0, code, "%s%s", out, errs)
			require.Equal(t, "free", strings.TrimSpace(out), "the next holder ran while the first tree was alive")
		})
	}
}

// The issue-11 flake, on the product side: sh forks a background sleep
// that may miss the SIGTERM and keeps the output open. The shell's exit
// code comes back at once, the sleep is terminated, the lock released.
func TestLockCancelForwardsTermAndReleases(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	dir := t.TempDir()
	marker, sleepPid := filepath.Join(dir, "started"), filepath.Join(dir, "sleep.pid")
	p := startLock(t, e.vars, "--key", "cli/cancel", "--grace", "1s", "--",
		"sh", "-c", `trap 'echo got-term; exit 5' TERM; sleep 30 & echo $! > "$1"; touch "$0"; wait`, marker, sleepPid)
	require.Eventually(t, func() bool { _, err := os.Stat(marker); return err == nil }, 30*time.Second, 10*time.Millisecond)
	b, err := os.ReadFile(sleepPid)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	t.Cleanup(func() {
		if procState(pid) != "" && procState(pid) != "Z" {
			if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); strings.HasSuffix(exe, "/sleep") {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Errorf("sleep (pid %d) outlived the test", pid)
			}
		}
	})

	p.signal(syscall.SIGTERM)
	code, out, errs := p.wait(20 * time.Second)
	require.Equal(t, 5, code, errs)
	require.Contains(t, out, "got-term")
	require.False(t, e.exists(t, "cli/cancel"), "released after the command ended")
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && strings.HasSuffix(exe, "/sleep") && procState(pid) != "Z" {
		t.Fatalf("the background sleep (pid %d) is still running", pid)
	}
}

// A command that ignores SIGTERM is dead before its lease can expire, also
// when the coordinator cannot reach Redis any more (it can neither renew nor
// release): the next holder, which gets the lock only when the TTL runs out,
// finds no process of the first tree alive.
func TestLockTerminatesBeforeTheLeaseCanExpire(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		vars []string
		args []string
	}{
		{"explicit lease", nil, []string{"--lease", "3s", "--grace", "1s"}},
		{"watchdog lease", []string{"COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "3s"}, []string{"--grace", "500ms"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newLockCLIEnv(t)
			proxy, viaProxy := newCutProxy(t, e.redis.URL)
			dir := t.TempDir()
			flockFile, ready := filepath.Join(dir, "flock"), filepath.Join(dir, "ready")
			noOrphans(t, ready)
			args := append(append([]string{"--key", "cli/expiry"}, c.args...), "--")
			args = append(args, helperArgv(t, "tree", "-flock", flockFile, "-ready", ready, "-ignore-term", "-escape")...)
			first := startLock(t, e.with(append(c.vars, "COORDINATOR_LOCK_REDIS_URL", viaProxy)...), args...)
			treePids(t, ready)
			proxy.Cut()

			second := startLock(t, e.vars, append([]string{"--key", "cli/expiry", "--wait", "60s", "--"}, helperArgv(t, "checkfree", flockFile)...)...)
			code, out, errs := second.wait(60 * time.Second)
			require.Equal(t, 0, code, "%s%s", out, errs)
			require.Equal(t, "free", strings.TrimSpace(out), "a second holder ran alongside the first tree")

			code, _, errs = first.wait(30 * time.Second)
			require.Equal(t, job.ExitLost, code, errs)
		})
	}
}

// When a renewal (or the coordinator's own check of the lock) finds the lock
// gone or someone else's, there is no time for a grace: SIGKILL at once.
func TestLockKillsAtOnceWhenTheLockIsTakenOver(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		vars []string
		args []string
	}{
		{"watchdog lease", []string{"COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "3s"}, nil},
		{"explicit lease", nil, []string{"--lease", "30s", "--grace", "20s"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newLockCLIEnv(t)
			dir := t.TempDir()
			ready, sigs := filepath.Join(dir, "ready"), filepath.Join(dir, "signals")
			noOrphans(t, ready)
			args := append(append([]string{"--key", "cli/takeover"}, c.args...), "--")
			args = append(args, helperArgv(t, "tree", "-ready", ready, "-signals", sigs, "-ignore-term", "-escape")...)
			p := startLock(t, e.with(c.vars...), args...)
			pids := treePids(t, ready)

			require.NoError(t, e.redis.Client.Del(context.Background(), e.lockKey("cli/takeover")).Err())
			e.holder(t, "cli/takeover")
			code, _, errs := p.wait(30 * time.Second)
			require.Equal(t, job.ExitLost, code, errs)
			require.Contains(t, errs, "lock_lost_killing_command")
			require.Empty(t, signalLines(sigs), "SIGKILL at once, no SIGTERM first")
			for role, pid := range pids {
				require.False(t, alive(t, pid), "%s is dead", role)
			}
			require.True(t, e.exists(t, "cli/takeover"), "the new holder's lock is untouched")
		})
	}
}

// One signal is forwarded to the command's group exactly once.
func TestLockForwardsEachSignalOnce(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		t.Run(unix.SignalName(sig), func(t *testing.T) {
			t.Parallel()
			e := newLockCLIEnv(t)
			dir := t.TempDir()
			ready, sigs := filepath.Join(dir, "ready"), filepath.Join(dir, "signals")
			noOrphans(t, ready)
			p := startLock(t, e.with("COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "60s"), append([]string{"--key", "cli/once", "--grace", "15s", "--"},
				helperArgv(t, "tree", "-ready", ready, "-signals", sigs, "-record-only")...)...)
			pids := treePids(t, ready)
			p.signal(sig)
			waitSignal(t, sigs, "root "+unix.SignalName(sig))
			// The command ends on its own; whatever the coordinator sent
			// before it ended has been recorded by then.
			require.NoError(t, syscall.Kill(pids["root"], syscall.SIGUSR1))
			code, _, errs := p.wait(30 * time.Second)
			require.Equal(t, 0, code, errs)
			require.Equal(t, []string{"root " + unix.SignalName(sig)}, signalLines(sigs))
			require.False(t, e.exists(t, "cli/once"))
		})
	}
}

// Cancellation: SIGTERM is forwarded, and a command that ignores it is
// killed after the grace; then the lock is released.
func TestLockCancellationKillsAfterTheGrace(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	dir := t.TempDir()
	ready, sigs := filepath.Join(dir, "ready"), filepath.Join(dir, "signals")
	noOrphans(t, ready)
	p := startLock(t, e.with("COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "30s"), append([]string{"--key", "cli/grace", "--grace", "1s", "--"},
		helperArgv(t, "tree", "-ready", ready, "-signals", sigs, "-ignore-term", "-escape")...)...)
	pids := treePids(t, ready)
	p.signal(syscall.SIGTERM)
	code, _, errs := p.wait(30 * time.Second)
	require.Equal(t, 128+int(syscall.SIGKILL), code, "killed after the grace: %s", errs)
	require.Equal(t, []string{"root SIGTERM"}, signalLines(sigs), "forwarded once, to the command's group")
	for role, pid := range pids {
		require.False(t, alive(t, pid), "%s is dead", role)
	}
	require.False(t, e.exists(t, "cli/grace"), "released after the tree is gone")
}

// A second signal does not wait for the grace: the tree is killed at once,
// and the lock is still released.
func TestLockSecondSignalKillsAtOnceAndReleases(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	dir := t.TempDir()
	ready, sigs := filepath.Join(dir, "ready"), filepath.Join(dir, "signals")
	noOrphans(t, ready)
	const grace = 15 * time.Second
	p := startLock(t, e.with("COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "60s"), append([]string{"--key", "cli/second", "--grace", grace.String(), "--"},
		helperArgv(t, "tree", "-ready", ready, "-signals", sigs, "-ignore-term", "-escape")...)...)
	pids := treePids(t, ready)
	p.signal(syscall.SIGTERM)
	waitSignal(t, sigs, "root SIGTERM")
	p.signal(syscall.SIGINT)
	// The bound is the behaviour under test: well inside the grace.
	code, _, errs := p.wait(grace / 2)
	require.Equal(t, 128+int(syscall.SIGKILL), code, errs)
	require.Equal(t, []string{"root SIGTERM"}, signalLines(sigs), "the second signal is not forwarded, it escalates")
	for role, pid := range pids {
		require.False(t, alive(t, pid), "%s is dead", role)
	}
	require.False(t, e.exists(t, "cli/second"), "released after the second signal")
}

// Off a terminal the command runs in a process group of its own; SIGTSTP
// and SIGCONT sent to the coordinator reach it, and the coordinator itself
// keeps running (and renewing).
func TestLockForwardsStopAndContinueOffATerminal(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	dir := t.TempDir()
	ready, sigs := filepath.Join(dir, "ready"), filepath.Join(dir, "signals")
	noOrphans(t, ready)
	p := startLock(t, e.with("COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "3s"), append([]string{"--key", "cli/stop", "--"},
		helperArgv(t, "tree", "-ready", ready, "-signals", sigs)...)...)
	root := treePids(t, ready)["root"]
	pgid, err := syscall.Getpgid(root)
	require.NoError(t, err)
	require.Equal(t, root, pgid, "the command leads its own process group")

	p.signal(syscall.SIGTSTP)
	require.Eventually(t, func() bool { return procState(root) == "T" }, 20*time.Second, 10*time.Millisecond, "the command stopped")
	require.NotEqual(t, "T", procState(p.cmd.Process.Pid), "the coordinator keeps running")
	p.signal(syscall.SIGCONT)
	waitSignal(t, sigs, "root SIGCONT")
	require.NotEqual(t, "T", procState(root))
	require.True(t, e.exists(t, "cli/stop"))
	require.NoError(t, syscall.Kill(root, syscall.SIGUSR1))
	code, _, errs := p.wait(30 * time.Second)
	require.Equal(t, 0, code, errs)
}

// What the coordinator reads as configuration does not reach the command:
// its COORDINATOR_* variables (secrets or not), the fallbacks DATABASE_URL
// and REDIS_URL, what pgx (PG*) and the OpenTelemetry SDK (OTEL_*) read.
// --pass-env hands one on deliberately (issue 24).
func TestLockScrubsTheConfigurationFromTheCommandEnvironment(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	keyFile := filepath.Join(t.TempDir(), "key.pem")
	require.NoError(t, os.WriteFile(keyFile, []byte("not a key"), 0o600))
	vars := e.with(
		"COORDINATOR_DATABASE_URL", "postgres://app:s3cret@127.0.0.1:1/x",
		"COORDINATOR_ADMIN_TOKEN", "0123456789abcdef0123456789abcdef-token",
		"COORDINATOR_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512",
		"COORDINATOR_KAFKA_SASL_USERNAME", "app",
		"COORDINATOR_KAFKA_SASL_PASSWORD", "kafka-s3cret",
		"COORDINATOR_KAFKA_TLS", "true",
		"COORDINATOR_LOCK_REDIS_PASSWORD_FILE", keyFile,
		"COORDINATOR_LOCK_KEY", "outer-key",
		"DATABASE_URL", "postgres://app:s3cret@127.0.0.1:1/y",
		"REDIS_URL", "redis://default:S3CRET@127.0.0.1:1/0",
		"PGPASSWORD", "pg-s3cret",
		"PGPASSFILE", "/etc/s3cret.pgpass",
		"PGHOST", "db.example",
		"OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer s3cret",
		"OTEL_SERVICE_NAME", "svc",
		"MY_SETTING", "kept",
		"REDIS_PASSWORD", "the command's own",
	)
	run := func(extra ...string) map[string]string {
		t.Helper()
		args := append(append([]string{"--key", "cli/scrub"}, extra...), "--")
		code, out, errs := startLock(t, vars, append(args, helperArgv(t, "tree", "-env")...)...).wait(30 * time.Second)
		require.Equal(t, 0, code, errs)
		require.Equal(t, 1, strings.Count(out, "COORDINATOR_LOCK_KEY="), "no duplicate")
		env := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			k, v, _ := strings.Cut(line, "=")
			env[k] = v
		}
		return env
	}

	env := run()
	for k := range env {
		require.NotContains(t, env[k], "s3cret", "%s reached the command", k)
		require.NotContains(t, env[k], "S3CRET", "%s reached the command", k)
		if strings.HasPrefix(k, "COORDINATOR_") {
			require.Contains(t, []string{"COORDINATOR_LOCK_KEY", "COORDINATOR_LOCK_OWNER", "COORDINATOR_LOCK_FENCE"}, k, "configuration reached the command")
		}
	}
	for _, k := range []string{"DATABASE_URL", "REDIS_URL", "PGPASSWORD", "PGPASSFILE", "PGHOST", "OTEL_EXPORTER_OTLP_HEADERS",
		"OTEL_SERVICE_NAME", "COORDINATOR_LOG_LEVEL", "COORDINATOR_LOCK_REDIS_URL", "COORDINATOR_LOCK_KEY_PREFIX"} {
		require.NotContains(t, env, k, "configuration reached the command")
	}
	require.Equal(t, "cli/scrub", env["COORDINATOR_LOCK_KEY"], "the lock's own variables, not the inherited one")
	require.Equal(t, "cli-test", env["COORDINATOR_LOCK_OWNER"])
	require.NotEmpty(t, env["COORDINATOR_LOCK_FENCE"])
	require.Equal(t, "kept", env["MY_SETTING"])
	require.Equal(t, "the command's own", env["REDIS_PASSWORD"], "not coordinator configuration: passed on")
	require.NotEmpty(t, env["PATH"])

	env = run("--pass-env", "PGPASSWORD", "--pass-env=DATABASE_URL", "--pass-env", "COORDINATOR_LOG_LEVEL")
	require.Equal(t, "pg-s3cret", env["PGPASSWORD"], "handed on deliberately")
	require.Equal(t, "postgres://app:s3cret@127.0.0.1:1/y", env["DATABASE_URL"])
	require.Equal(t, "warn", env["COORDINATOR_LOG_LEVEL"])
	require.NotContains(t, env, "PGPASSFILE", "only what --pass-env names")
	require.NotContains(t, env, "REDIS_URL")

	code, _, errs := lockCLI(t, e.vars, "lock", "--key", "cli/scrub", "--pass-env", "MY_SETTING", "--", "true")
	require.Equal(t, job.ExitUsage, code, "a --pass-env of a variable the command gets anyway is a mistake: %s", errs)
	require.Contains(t, errs, "--pass-env MY_SETTING")
}

// The scrubbed variables are not the command's by another way either: the
// command runs as the coordinator's user, and a process of the same user
// may read another's /proc/PID/environ (and mem), where the coordinator's
// environment stays as it was given. The coordinator is not dumpable, so
// those are closed to the command. As root (CI), the coordinator runs as
// nobody: root may read any process's.
func TestLockCommandCannotReadTheCoordinatorsEnvironment(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	bin := coordinatorBinary(t)
	cmd := exec.Command(bin, "lock", "--key", "cli/procenv", "--",
		"sh", "-c", `echo "parent $PPID"; cat /proc/$PPID/environ; echo; echo "ran"`)
	cmd.Env = lockEnv(e.with(
		"DATABASE_URL", "postgres://app:s3cret@127.0.0.1:1/y",
		"COORDINATOR_ADMIN_TOKEN", "0123456789abcdef0123456789abcdef-s3cret"))
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		// The binary's directory must let nobody in.
		require.NoError(t, os.Chmod(filepath.Dir(bin), 0o755))
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 65534, Gid: 65534}
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Start())
	require.NoError(t, cmd.Wait(), "%s%s", out.String(), errb.String())
	require.Contains(t, out.String(), "ran\n", errb.String())
	require.Contains(t, out.String(), fmt.Sprintf("parent %d\n", cmd.Process.Pid), "the command's parent is the coordinator")
	require.NotContains(t, out.String(), "s3cret", "the command read the coordinator's environment from /proc")
	require.Contains(t, errb.String(), "Permission denied")
}

// Every variable the configuration reads (config.Variables, derived from
// its settings) is kept from the command by the wiring lock runs with; the
// config package's own test keeps Variables complete.
func TestLockKeepsEveryConfigurationVariableFromTheCommand(t *testing.T) {
	t.Parallel()
	c := lockRunConfig(lockrun.Args{}, config.Config{}, cliIO{}, nil)
	for _, name := range config.Variables() {
		require.True(t, c.Removed(name), "%s reaches the locked command", name)
	}
	for _, name := range []string{"PGPASSWORD", "PGPASSFILE", "PGSSLKEY", "OTEL_EXPORTER_OTLP_HEADERS"} {
		require.True(t, c.Removed(name), "%s reaches the locked command", name)
	}
	for _, name := range []string{"PATH", "HOME", "TZ", "LANG"} {
		require.False(t, c.Removed(name), name)
	}
	// docs/lock-command.md names every fallback and family.
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "lock-command.md"))
	require.NoError(t, err)
	for _, name := range config.Variables() {
		if !strings.HasPrefix(name, "COORDINATOR_") {
			require.Contains(t, string(doc), "`"+name+"`", "docs/lock-command.md does not list %s", name)
		}
	}
	for _, p := range config.VariablePrefixes {
		require.Contains(t, string(doc), "`"+p+"*`", "docs/lock-command.md does not list %s*", p)
	}
}

func TestLocksCommand(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	held := e.holder(t, "cli/listed")
	code, out, errs := lockCLI(t, e.vars, "locks", "--json")
	require.Equal(t, 0, code, errs)
	var locks []ownership.LockInfo
	require.NoError(t, json.Unmarshal([]byte(out), &locks), out)
	require.Len(t, locks, 1)
	require.Equal(t, "cli/listed", locks[0].Key)
	require.Equal(t, "other-replica", locks[0].Owner)
	require.Equal(t, held.Fence(), locks[0].Fence)

	code, out, _ = lockCLI(t, e.vars, "locks")
	require.Equal(t, 0, code)
	require.Contains(t, out, "KEY")
	require.Contains(t, out, "cli/listed")
	require.Contains(t, out, "other-replica")

	code, _, _ = lockCLI(t, map[string]string{"COORDINATOR_LOCK_REDIS_URL": "redis://127.0.0.1:1/0", "COORDINATOR_LOG_LEVEL": "error"}, "locks")
	require.Equal(t, job.ExitUnavailable, code)
}

// A signal while the coordinator waits for the lock ends the wait: the
// command never runs, and the exit status is the signal's (128+N), not
// "already owned" (75), which would tell a caller that another holder ran
// the work.
func TestLockSignalWhileWaitingExitsWithTheSignal(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	held := e.holder(t, "cli/waitsig")
	marker := filepath.Join(t.TempDir(), "ran")
	p := startLock(t, e.vars, "--key", "cli/waitsig", "--wait", "60s", "--", "touch", marker)
	queue := e.redis.Prefix + ":{cli/waitsig}:queue"
	require.Eventually(t, func() bool {
		n, err := e.redis.Client.ZCard(context.Background(), queue).Result()
		return err == nil && n == 1
	}, 20*time.Second, 10*time.Millisecond, "the coordinator queued for the lock")
	p.signal(syscall.SIGTERM)
	code, _, errs := p.wait(20 * time.Second)
	require.Equal(t, 128+int(syscall.SIGTERM), code, errs)
	require.NoFileExists(t, marker, "the command must not run")
	require.NoError(t, held.Err(), "the holder's lock is untouched")
	require.True(t, e.exists(t, "cli/waitsig"))
}

// Renewals that reach the master but no replica (Redis WAIT, replicas
// required) do not count: the lease's trust deadline stays where the last
// acknowledged renewal put it, though the master's TTL keeps being reset.
// The command must still be terminated as the lease runs out, SIGTERM and
// then SIGKILL a kill margin before the trust deadline, not be SIGKILLed
// without warning once the lease is already lost.
func TestLockTerminatesInTimeWhenRenewalsAreNotReplicated(t *testing.T) {
	t.Parallel()
	set := testenv.StartRedisSentinelSet(t)
	vars := map[string]string{
		"COORDINATOR_LOCK_REDIS_URL":          set.URL(),
		"COORDINATOR_LOCK_REDIS_MODE":         "sentinel",
		"COORDINATOR_LOCK_REDIS_WAIT_TIMEOUT": "500ms",
		"COORDINATOR_LOCK_KEY_PREFIX":         "unrepl",
		"COORDINATOR_REPLICA_ID":              "cli-test",
		"COORDINATOR_LOCK_WATCHDOG_TIMEOUT":   "6s",
		"COORDINATOR_LOG_LEVEL":               "warn",
	}
	dir := t.TempDir()
	ready, sigs := filepath.Join(dir, "ready"), filepath.Join(dir, "signals")
	noOrphans(t, ready)
	// The acquisition needs the replica's acknowledgement too, which a
	// loaded machine's replica may not give within the WAIT timeout: that
	// acquisition fails closed and is asked again within --wait, a budget
	// that holds on a loaded machine. What is under test is what follows.
	p := startLock(t, vars, append([]string{"--key", "cli/unrepl", "--grace", "1s", "--wait", "60s", "--"},
		helperArgv(t, "tree", "-ready", ready, "-signals", sigs, "-ignore-term")...)...)
	pids := p.treePids(t, ready)
	set.Replica.Pause()
	t.Cleanup(set.Replica.Resume)

	code, _, errs := p.wait(60 * time.Second)
	require.Equal(t, job.ExitLost, code, errs)
	require.Equal(t, []string{"root SIGTERM"}, signalLines(sigs),
		"SIGTERM a grace before the lease could end, not SIGKILL out of the blue once it was lost:\n%s", errs)
	require.NotContains(t, errs, "lock_lost_killing_command", "killed only after the lease was already lost")
	for role, pid := range pids {
		require.False(t, alive(t, pid), "%s is dead", role)
	}
}

// lockACLUser creates docs/security.md's minimal Redis user for the test's
// prefix (the rule with the user name, password and prefix replaced) and
// returns its URL; the user is removed when the test ends.
func lockACLUser(t *testing.T, e *lockCLIEnv) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "security.md"))
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)<!-- redis-acl:begin -->\\s*```\\s*(ACL SETUSER [^\\n]+)\\s*```\\s*<!-- redis-acl:end -->").FindSubmatch(b)
	require.NotNil(t, m, "docs/security.md: no ACL SETUSER rule between the redis-acl markers")
	user, password := testenv.UniqueName("acl"), testenv.UniqueName("pw")
	rule := strings.ReplaceAll(string(m[1]), "coordinator:", e.redis.Prefix+":")
	rule = strings.Replace(rule, "ACL SETUSER coordinator ", "ACL SETUSER "+user+" ", 1)
	rule = strings.Replace(rule, ">PASSWORD", ">"+password, 1)
	var args []any
	for _, f := range strings.Fields(rule) {
		args = append(args, f)
	}
	ctx := context.Background()
	require.NoError(t, e.redis.Client.Do(ctx, args...).Err(), "%s", rule)
	t.Cleanup(func() { e.redis.Client.Do(context.Background(), "ACL", "DELUSER", user) })
	u, err := url.Parse(e.redis.URL)
	require.NoError(t, err)
	u.User = url.UserPassword(user, password)
	return u.String()
}

// Under the minimal ACL of docs/security.md, a command holding a watchdog
// lease whose renewals succeed runs to its end: the coordinator's check of
// the lock's TTL on Redis must work under that ACL too, or its termination
// clock never moves past the acquisition's own trust deadline.
func TestLockUnderTheMinimalACLKeepsAHealthyWatchdogLease(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	vars := e.with("COORDINATOR_LOCK_REDIS_URL", lockACLUser(t, e), "COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "3s")
	// Twice the TTL: the command outlives the acquisition's trust deadline
	// by far, on renewals alone.
	code, _, errs := startLock(t, vars, "--key", "cli/acl", "--grace", "500ms", "--", "sleep", "6").wait(60 * time.Second)
	require.Equal(t, 0, code, "the command was terminated though its lease was renewed:\n%s", errs)
	require.False(t, e.exists(t, "cli/acl"), "released")
}

// --wait 0 (or COORDINATOR_LOCK_WAIT_TIME=0) is "do not wait", as flock -n:
// one try, then exit 75; not the Lockers' default wait of 5s.
func TestLockWaitZeroTriesOnce(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	e.holder(t, "cli/nowait")
	coordinatorBinary(t) // built before the clock starts
	for _, c := range []struct {
		name string
		vars map[string]string
		args []string
	}{
		{"flag", e.vars, []string{"--wait", "0"}},
		{"variable", e.with("COORDINATOR_LOCK_WAIT_TIME", "0"), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "ran")
			args := append(append([]string{"--key", "cli/nowait"}, c.args...), "--", "touch", marker)
			start := time.Now()
			code, _, errs := startLock(t, c.vars, args...).wait(30 * time.Second)
			took := time.Since(start)
			require.Equal(t, job.ExitAlreadyOwned, code, errs)
			require.NoFileExists(t, marker)
			// The bound is the behaviour under test: a 5s wait would take
			// longer, one try (and the process's start) far less.
			require.Less(t, took, 4*time.Second, "waited for the lock")
		})
	}
}
