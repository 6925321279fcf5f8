package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
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
		"COORDINATOR_LOCK_WATCHDOG_TIMEOUT": "600ms",
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

func TestLockRunsCommandWithLockEnv(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	code, out, errs := lockCLI(t, e.vars, "lock", "--key", "cli/env", "--",
		"sh", "-c", `echo "$COORDINATOR_LOCK_KEY $COORDINATOR_LOCK_OWNER $COORDINATOR_LOCK_FENCE"; exit 7`)
	require.Equal(t, 7, code, "the command's own exit code: %s", errs)
	fields := strings.Fields(out)
	require.Len(t, fields, 3, out)
	require.Equal(t, "cli/env", fields[0])
	require.Equal(t, "cli-test", fields[1])
	fence, err := strconv.ParseInt(fields[2], 10, 64)
	require.NoError(t, err)
	require.Positive(t, fence)
	n, err := e.redis.Client.Exists(context.Background(), e.lockKey("cli/env")).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the lock is released when the command ends")

	code, out, _ = lockCLI(t, e.vars, "lock", "--key=cli/env", "--lease", "5s", "--", "sh", "-c", `echo $COORDINATOR_LOCK_FENCE`)
	require.Equal(t, 0, code)
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
	code, out, errs := lockCLI(t, down, "lock", "--key", "cli/down", "--", "echo", "ran")
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

// waitFile waits until the command has created path (its traps are set).
func waitFile(t *testing.T, path string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := os.Stat(path)
		return err == nil
	}, 5*time.Second, 5*time.Millisecond)
}

func TestLockLeaseLostTerminatesCommand(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	marker := filepath.Join(t.TempDir(), "started")
	res := startCLI(context.Background(), e.vars, "lock", "--key", "cli/lost", "--grace", "5s", "--",
		"sh", "-c", `trap 'echo got-term; exit 0' TERM; touch "$0"; sleep 30 & wait`, marker)
	waitFile(t, marker)
	require.NoError(t, e.redis.Client.Del(context.Background(), e.lockKey("cli/lost")).Err())
	select {
	case r := <-res:
		require.Equal(t, job.ExitLost, r.code, r.stderr)
		require.Contains(t, r.stdout, "got-term")
		require.Contains(t, r.stderr, "lock_lost_terminating_command")
	case <-time.After(5 * time.Second):
		t.Fatal("lock did not end after its lease was lost")
	}
}

func TestLockLeaseLostKillsAfterGrace(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	const grace = 300 * time.Millisecond
	marker := filepath.Join(t.TempDir(), "started")
	res := startCLI(context.Background(), e.vars, "lock", "--key", "cli/stubborn", "--grace", grace.String(), "--",
		"sh", "-c", `trap '' TERM; touch "$0"; sleep 30 & wait`, marker)
	waitFile(t, marker)
	require.NoError(t, e.redis.Client.Del(context.Background(), e.lockKey("cli/stubborn")).Err())
	deleted := time.Now()
	select {
	case r := <-res:
		require.Equal(t, job.ExitLost, r.code, r.stderr)
		require.Contains(t, r.stderr, "lock_command_killed")
		require.GreaterOrEqual(t, time.Since(deleted), grace, "SIGKILL before the grace period")
	case <-time.After(5 * time.Second):
		t.Fatal("a command ignoring SIGTERM was not killed")
	}
}

func TestLockCancelForwardsTermAndReleases(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	marker := filepath.Join(t.TempDir(), "started")
	res := startCLI(ctx, e.vars, "lock", "--key", "cli/cancel", "--",
		"sh", "-c", `trap 'echo got-term; exit 5' TERM; touch "$0"; sleep 30 & wait`, marker)
	waitFile(t, marker)
	cancel()
	select {
	case r := <-res:
		require.Equal(t, 5, r.code, r.stderr)
		require.Contains(t, r.stdout, "got-term")
	case <-time.After(5 * time.Second):
		t.Fatal("cancellation was not forwarded")
	}
	n, err := e.redis.Client.Exists(context.Background(), e.lockKey("cli/cancel")).Result()
	require.NoError(t, err)
	require.Zero(t, n, "released after the command ended")
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
