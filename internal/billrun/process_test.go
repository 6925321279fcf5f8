package billrun_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// The tests in this file run the built `coordinator` binary as separate
// processes, with the real Redis locker and real Postgres: one process per
// replica, so that kill -9 and SIGSTOP hit a whole replica.

// world is what every replica process of one test shares: a schema of its
// own and a Redis key prefix of its own.
type world struct {
	*bundle
	dsn, redisURL, prefix string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	return &world{bundle: &bundle{pool: pg.Pool}, dsn: pg.DSN, redisURL: rd.URL, prefix: rd.Prefix}
}

// replica is one `coordinator run billrun` process.
type replica struct {
	id     string
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr *os.File
	done   chan struct{}
	err    error
}

// start runs `coordinator run billrun --period P` as replica id; env adds
// to (and overrides) the base settings.
func (w *world) start(t *testing.T, id string, env ...string) *replica {
	t.Helper()
	bin := testenv.CoordinatorBinary(t)
	r := &replica{id: id, done: make(chan struct{})}
	r.cmd = exec.Command(bin, "run", "billrun", "--period", period.String())
	base := []string{
		"COORDINATOR_DATABASE_URL=" + w.dsn,
		"COORDINATOR_LOCK_REDIS_URL=" + w.redisURL,
		"COORDINATOR_LOCK_KEY_PREFIX=" + w.prefix,
		"COORDINATOR_REPLICA_ID=" + id,
		// Renewed every second: a busy machine does not stall a renewal
		// for the ~2s it would take to lose a lease the test needs held.
		"COORDINATOR_LOCK_WATCHDOG_TIMEOUT=3s",
		"COORDINATOR_LOCK_WAIT_TIME=30s",
		"COORDINATOR_BILLRUN_BATCH_SIZE=100",
		"COORDINATOR_BILLRUN_WORKERS=2",
		"COORDINATOR_LOG_FORMAT=json",
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "COORDINATOR_") && !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "REDIS_URL=") {
			r.cmd.Env = append(r.cmd.Env, kv)
		}
	}
	r.cmd.Env = append(append(r.cmd.Env, base...), env...)
	// A replica dies with the test binary, even one killed by a timeout.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r.cmd.Stdout = &r.stdout
	f, err := os.CreateTemp(t.TempDir(), id+"-stderr-")
	require.NoError(t, err)
	r.stderr = f
	r.cmd.Stderr = f
	require.NoError(t, r.cmd.Start())
	go func() {
		r.err = r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			_ = r.cmd.Process.Signal(syscall.SIGCONT)
			_ = r.cmd.Process.Kill()
			<-r.done
		}
		if strings.Contains(r.logs(), "WARNING: DATA RACE") {
			t.Errorf("replica %s: the race detector found a data race:\n%s", id, r.logs())
		}
	})
	return r
}

// wait waits for the process to exit and returns its exit code and result.
func (r *replica) wait(t *testing.T, within time.Duration) (int, job.Result) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(within):
		t.Fatalf("replica %s did not exit within %s; stderr:\n%s", r.id, within, r.logs())
	}
	code := r.cmd.ProcessState.ExitCode()
	var res job.Result
	if line := strings.TrimSpace(r.stdout.String()); line != "" {
		require.NoError(t, json.Unmarshal([]byte(line), &res), "stdout: %s", line)
	}
	return code, res
}

func (r *replica) logs() string {
	b, _ := os.ReadFile(r.stderr.Name())
	return string(b)
}

// eventTypes returns the CloudEvents types the process wrote on stderr, with
// their data.
func (r *replica) events(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(r.logs()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev map[string]any
		if json.Unmarshal(sc.Bytes(), &ev) == nil && ev["specversion"] == "1.0" {
			out = append(out, ev)
		}
	}
	return out
}

func (r *replica) hasEvent(t *testing.T, typ string) map[string]any {
	t.Helper()
	for _, ev := range r.events(t) {
		if ev["type"] == typ {
			return ev["data"].(map[string]any)
		}
	}
	return nil
}

// waitBatches waits until at least n batches are committed.
func (w *world) waitBatches(t *testing.T, n int64) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var got int64
		require.NoError(c, w.pool.QueryRow(context.Background(), `select count(*) from bill_run_batches`).Scan(&got))
		assert.GreaterOrEqual(c, got, n, "batches committed")
	}, 30*time.Second, 20*time.Millisecond)
}

func TestProcessThreeConcurrentRuns(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.seed(t, billrun.SeedConfig{Subscribers: 3000, SuspendedRatio: 0.1, TerminatedRatio: 0.1, Usage: true})
	var reps []*replica
	for i := range 3 {
		// Short waits for one of them, so both losing outcomes can show up.
		wait := []string{"30s", "30s", "100ms"}[i]
		reps = append(reps, w.start(t, fmt.Sprintf("replica-%d", i),
			"COORDINATOR_LOCK_WAIT_TIME="+wait, "COORDINATOR_TEST_BILLRUN_BATCH_DELAY=20ms"))
	}
	completed := ""
	outcomes := map[job.Outcome]int{}
	for _, r := range reps {
		code, res := r.wait(t, 60*time.Second)
		outcomes[res.Outcome]++
		require.Equal(t, res.Outcome.ExitCode(), code, "%s: %s", r.id, r.logs())
		switch res.Outcome {
		case job.OutcomeCompleted:
			completed = r.id
		case job.OutcomeAlreadyOwned:
			require.NotNil(t, r.hasEvent(t, "ownership.already_owned"), r.id)
		case job.OutcomeAlreadyCompleted:
			require.NotNil(t, r.hasEvent(t, "run.already_completed"), r.id)
		default:
			t.Fatalf("%s: outcome %s: %s", r.id, res.Outcome, r.logs())
		}
	}
	require.Equal(t, 1, outcomes[job.OutcomeCompleted], "%v", outcomes)
	for _, r := range reps {
		if ev := r.hasEvent(t, "ownership.already_owned"); ev != nil {
			require.Equal(t, completed, ev["owner"], "already_owned names the owner")
		}
	}
	w.requireExactlyOnce(t, period)
	st := statusOf(t, w)
	require.Equal(t, billrun.StatusCompleted, st.Status)
	require.Equal(t, completed, st.Owner)
}

func TestProcessKill9MidRunThenResume(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.seed(t, billrun.SeedConfig{Subscribers: 2000, SuspendedRatio: 0.1, Usage: true})
	a := w.start(t, "replica-a", "COORDINATOR_TEST_BILLRUN_BATCH_DELAY=100ms")
	w.waitBatches(t, 3)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	<-a.done
	require.Equal(t, -1, a.cmd.ProcessState.ExitCode(), "killed by a signal")
	committedByA := w.count(t, `select count(*) from bill_run_batches`)
	require.Less(t, committedByA, int64(18), "replica-a was killed mid-run")

	b := w.start(t, "replica-b")
	code, res := b.wait(t, 60*time.Second)
	require.Equal(t, 0, code, b.logs())
	require.Equal(t, job.OutcomeCompleted, res.Outcome)
	require.Equal(t, int64(2), res.Fence)
	// Counted again now: a COMMIT the server had received before the kill
	// may land after the count above, so that one was only a lower bound.
	committedByA = w.count(t, `select count(*) from bill_run_batches where owner = 'replica-a'`)
	require.Equal(t, committedByA, res.Counts["batches_skipped"])
	require.Positive(t, res.Counts["batches_skipped"])
	require.Equal(t, int64(0), res.Counts["already_invoiced"], "no subscriber billed twice")
	w.requireExactlyOnce(t, period)
	st := statusOf(t, w)
	require.Equal(t, billrun.StatusCompleted, st.Status)
	require.Equal(t, "replica-b", st.Owner)
}

// The paused owner: SIGSTOP past its lease; another replica claims and
// completes; SIGCONT. The paused one cannot commit another batch and ends
// lost (exit 76); bill_runs shows the new owner, COMPLETED.
func TestProcessPausedOwnerCannotCommit(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.seed(t, billrun.SeedConfig{Subscribers: 2000, SuspendedRatio: 0.1})
	a := w.start(t, "replica-a", "COORDINATOR_TEST_BILLRUN_BATCH_DELAY=150ms")
	w.waitBatches(t, 2)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))

	// replica-b waits out a's lease (3s watchdog timeout), claims fence 2 and completes.
	b := w.start(t, "replica-b")
	code, res := b.wait(t, 60*time.Second)
	require.Equal(t, 0, code, b.logs())
	require.Equal(t, job.OutcomeCompleted, res.Outcome)
	require.Equal(t, int64(2), res.Fence)
	require.Positive(t, res.Counts["batches_skipped"])
	byA := w.count(t, `select count(*) from bill_run_batches where fence = 1`)

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	code, res = a.wait(t, 30*time.Second)
	require.Equal(t, job.ExitLost, code, a.logs())
	require.Equal(t, job.OutcomeLost, res.Outcome)
	lost := a.hasEvent(t, "ownership.lost")
	require.NotNil(t, lost, a.logs())
	require.Contains(t, []any{billrun.ReasonLeaseLost, billrun.ReasonFenceLost}, lost["reason"])

	require.Equal(t, byA, w.count(t, `select count(*) from bill_run_batches where fence = 1`), "no batch committed under the stale fence after SIGCONT")
	require.Equal(t, int64(0), w.count(t, `
		select count(*) from bill_run_batches b, bill_runs r
		where b.period = r.period and b.fence = 1 and b.committed_at >= r.started_at`), "every stale batch committed before the new claim")
	st := statusOf(t, w)
	require.Equal(t, billrun.StatusCompleted, st.Status)
	require.Equal(t, "replica-b", st.Owner)
	require.Equal(t, int64(2), st.Fence)
	w.requireExactlyOnce(t, period)
}

// statusOf reads the period's bill_runs row.
func statusOf(t *testing.T, w *world) billrun.Status {
	t.Helper()
	st, err := billrun.ReadStatus(context.Background(), w.pool, period)
	require.NoError(t, err)
	return st
}
