package main

// `coordinator lock` when Redis stalls (DEBUG SLEEP, CLIENT PAUSE ... WRITE)
// on a throwaway redis-server of the test's own: the shared one is never
// stalled.

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// stallableRedis is a redis-server that accepts DEBUG, and the lock
// configuration on it.
func stallableRedis(t *testing.T) (*testenv.RedisServer, map[string]string) {
	t.Helper()
	srv := testenv.StartRedisServerWith(t, testenv.RedisServerOptions{Args: []string{"--enable-debug-command", "yes"}})
	return srv, map[string]string{
		"COORDINATOR_LOCK_REDIS_URL":  srv.URL(),
		"COORDINATOR_LOCK_KEY_PREFIX": "stall",
		"COORDINATOR_REPLICA_ID":      "cli-test",
		"COORDINATOR_LOG_LEVEL":       "info",
	}
}

// stallRedis stalls srv for d, as the DEBUG SLEEP or CLIENT PAUSE
// WRITE did, and returns once the stall has begun.
func stallRedis(t *testing.T, srv *testenv.RedisServer, how string, d time.Duration) {
	t.Helper()
	switch how {
	case "debug sleep":
		srv.Stall(t, d)
	case "client pause write":
		ms := strconv.FormatInt(d.Milliseconds(), 10)
		require.NoError(t, srv.Client(t).Do(context.Background(), "client", "pause", ms, "write").Err())
	default:
		t.Fatalf("unknown stall %q", how)
	}
}

// Issue 24: the command ends well inside its lease while Redis stalls; the
// release, answered only after the stall, finds the lease expired. The
// command finished while its lease was trusted: lock exits with the
// command's own status and warns that the lock was found gone, not 76
// (which tells a wrapper the command was cut short, and makes it run a
// finished job again).
func TestLockReturnsTheCommandsStatusWhenTheLeaseEndsAfterIt(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"debug sleep", "client pause write"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			srv, vars := stallableRedis(t)
			dir := t.TempDir()
			started, finish := filepath.Join(dir, "started"), filepath.Join(dir, "finish")
			// The command ends as soon as the stall has begun, as in the
			// issue (stall at 0.45s, exit at 0.5s).
			p := startLock(t, vars, "--key", "ds", "--lease", "3s", "--",
				"sh", "-c", `touch "$0"; while [ ! -e "$1" ]; do sleep 0.01; done; exit 7`, started, finish)
			require.Eventually(t, func() bool { _, err := os.Stat(started); return err == nil },
				30*time.Second, 5*time.Millisecond, "the command never started: %s", p.readErr())
			// Longer than the lease: the release is answered after the
			// lock's TTL has run out.
			stallRedis(t, srv, how, 3300*time.Millisecond)
			require.NoError(t, os.WriteFile(finish, nil, 0o644))
			code, _, errs := p.wait(60 * time.Second)
			require.Equal(t, 7, code, "the command's own status:\n%s", errs)
			// Answered after the stall, the release finds the lock expired
			// (lock_lost_after_command); or, when go-redis' resend needs a
			// new connection that DEBUG SLEEP does not let it make in time,
			// it times out (lock_release_failed). Either way it is a
			// warning and the status is the command's.
			require.Regexp(t, "lock_lost_after_command|lock_release_failed", errs, "the release's trouble is reported")
		})
	}
}

// Issue 24: A holds p2 (watchdog 3s) when Redis pauses writes for 4s; B
// asks for p2 with --wait 20s during the pause. B's acquisition is answered
// only after the pause, past the time it could have been trusted for. B
// gives that acquisition back (by its token) and keeps waiting within its
// --wait, instead of exiting 76 with 16s of it unused; it gets the lock
// and runs its command once A's tree is gone.
func TestLockWaiterRetriesAnAcquisitionThatCameBackTooLate(t *testing.T) {
	t.Parallel()
	srv, vars := stallableRedis(t)
	vars["COORDINATOR_LOCK_WATCHDOG_TIMEOUT"] = "3s"
	dir := t.TempDir()
	flockFile, ready := filepath.Join(dir, "flock"), filepath.Join(dir, "ready")
	noOrphans(t, ready)
	a := startLock(t, vars, append([]string{"--key", "p2", "--"},
		helperArgv(t, "tree", "-flock", flockFile, "-ready", ready, "-ignore-term")...)...)
	a.treePids(t, ready)

	require.NoError(t, srv.Client(t).Do(context.Background(), "client", "pause", "4000", "write").Err())
	b := startLock(t, vars, append([]string{"--key", "p2", "--wait", "20s", "--"}, helperArgv(t, "checkfree", flockFile)...)...)

	code, out, errs := b.wait(60 * time.Second)
	require.Equal(t, 0, code, "B waits on within --wait and runs its command:\n%s%s", out, errs)
	require.Equal(t, "free", strings.TrimSpace(out), "B's command ran while A's tree was alive")
	require.NotContains(t, errs, "lock_lost_before_start")
	// Which way the pause reached B depends on timing: its acquisition
	// answered after the pause, too late to trust (given back), or timed
	// out by go-redis during it (asked again). Both keep B waiting.
	require.Regexp(t, "lock_acquired_too_late|lock_backend_unavailable_waiting", errs, "B met the pause")
	t.Logf("B's log:\n%s", errs)

	code, _, errs = a.wait(60 * time.Second)
	require.Equal(t, job.ExitLost, code, "A's lease ran out during the pause:\n%s", errs)
}

// The overlap a forward clock step on the Redis host can cause under
// `coordinator lock` (docs/lock.md, "Clock steps"), emulated as in
// redislock's TestClockStepOverlap: the lock's PEXPIRE is cut to 1 ms behind
// the coordinator's back and another holder acquires. The overlap is the
// time from that acquisition until the command is dead. The coordinator
// reads the lock on Redis every tenth of the TTL (at most every 10s) and
// kills the tree at once when it is gone, in both modes: the overlap is at
// most that probe interval (plus a round trip and the kill), not TTL/3 or
// the whole lease as for a library holder. Run with -v for the figures.
func TestLockClockStepOverlap(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		vars  []string
		args  []string
		probe time.Duration // every TTL/10, at most 10s
	}{
		{"watchdog 3s", []string{"COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "3s"}, nil, 300 * time.Millisecond},
		{"explicit lease 3s", nil, []string{"--lease", "3s", "--grace", "500ms"}, 300 * time.Millisecond},
		{"explicit lease 60s", nil, []string{"--lease", "60s"}, 6 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newLockCLIEnv(t)
			ready := filepath.Join(t.TempDir(), "ready")
			noOrphans(t, ready)
			key := "cli/step"
			args := append(append([]string{"--key", key}, c.args...), "--")
			p := startLock(t, e.with(c.vars...), append(args, helperArgv(t, "tree", "-ready", ready, "-ignore-term")...)...)
			root := p.treePids(t, ready)["root"]

			require.NoError(t, e.redis.Client.PExpire(context.Background(), e.lockKey(key), time.Millisecond).Err())
			e.holder(t, key)
			both := time.Now()
			require.Eventually(t, func() bool { return !alive(t, root) }, c.probe+10*time.Second, time.Millisecond,
				"the command still runs after another holder took the lock")
			overlap := time.Since(both)
			t.Logf("%s: overlap %s (probe every %s)", c.name, overlap.Round(time.Millisecond), c.probe)
			code, _, errs := p.wait(30 * time.Second)
			require.Equal(t, job.ExitLost, code, errs)
			require.Contains(t, errs, "lock_lost_killing_command")
			// The bound is the behaviour under test, with a loaded
			// machine's margin.
			require.Less(t, overlap, c.probe+time.Second)
		})
	}
}

// A waiter's --wait also covers a Redis that does not answer for a while:
// writes paused for 5s time out the acquire (go-redis' read timeout is 2s),
// and the coordinator asks again within its budget instead of exiting 69
// with most of it unused.
func TestLockWaiterWaitsOutAnUnavailableRedis(t *testing.T) {
	t.Parallel()
	srv, vars := stallableRedis(t)
	marker := filepath.Join(t.TempDir(), "ran")
	coordinatorBinary(t) // built before the pause starts
	require.NoError(t, srv.Client(t).Do(context.Background(), "client", "pause", "5000", "write").Err())
	code, _, errs := startLock(t, vars, "--key", "p3", "--wait", "30s", "--", "touch", marker).wait(60 * time.Second)
	require.Equal(t, 0, code, errs)
	require.FileExists(t, marker)
	require.Contains(t, errs, "lock_backend_unavailable_waiting")
}
