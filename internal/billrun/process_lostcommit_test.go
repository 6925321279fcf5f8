package billrun_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// Issue 23's reproduction, with the real binary: three `coordinator run
// billrun` replicas (batches of 100) on a Postgres that loses acknowledged
// commits (synchronous_commit=off, the WAL writer asleep), restarted -m
// immediate twice mid-run. Whatever each replica ends with, a replica that
// says completed leaves every subscriber of the period invoiced exactly
// once, and its run.completed counts are what the database says; a period
// not COMPLETED yet is completed by a later run.
func TestProcessLostCommitsNeverCompleteAGap(t *testing.T) {
	t.Parallel()
	srv, pool := ownServer(t, "synchronous_commit=off", "wal_writer_delay=10s", "autovacuum=off")
	rd := testenv.Redis(t)
	w := &world{bundle: &bundle{pool: pool}, dsn: srv.DSN(), redisURL: rd.URL, prefix: rd.Prefix}
	seeded := w.seed(t, billrun.SeedConfig{Subscribers: 20000, SuspendedRatio: 0.1, Usage: true})
	_, err := pool.Exec(context.Background(), `checkpoint`)
	require.NoError(t, err)

	env := []string{"COORDINATOR_LOCK_WAIT_TIME=30s", "COORDINATOR_TEST_BILLRUN_BATCH_DELAY=15ms"}
	var reps []*replica
	for i := range 3 {
		reps = append(reps, w.start(t, fmt.Sprintf("replica-%d", i), env...))
	}
	batches := func(c *assert.CollectT) int64 {
		var n int64
		require.NoError(c, pool.QueryRow(context.Background(), `select count(*) from bill_run_batches`).Scan(&n))
		return n
	}
	for _, at := range []int64{40, 110} {
		require.EventuallyWithT(t, func(c *assert.CollectT) { require.GreaterOrEqual(c, batches(c), at) }, 60*time.Second, 20*time.Millisecond,
			"replicas' logs: %s", replicaLogs(reps))
		srv.Kill()
		srv.Start()
		pool.Reset() // the test's own connections died with the server
	}

	var completed []job.Result
	check := func(r *replica) {
		code, res := r.wait(t, 120*time.Second)
		require.Equal(t, res.Outcome.ExitCode(), code, "%s: %s", r.id, r.logs())
		t.Logf("%s: %s %v %s", r.id, res.Outcome, res.Counts, res.Error)
		if res.Outcome == job.OutcomeCompleted {
			completed = append(completed, res)
		}
	}
	for _, r := range reps {
		check(r)
	}
	for i := 0; len(completed) == 0 && i < 3; i++ { // the replicas gave up: a later run finishes the period
		check(w.start(t, fmt.Sprintf("later-%d", i), env...))
	}
	require.Len(t, completed, 1, "exactly one run completed the period")
	w.requireExactlyOnce(t, period)
	res := completed[0]
	require.Equal(t, seeded.Active, res.Counts[billrun.CountPopulation])
	require.Equal(t, w.count(t, `select count(*) from invoices where period = $1`, period.String()), res.Counts[billrun.CountPeriodInvoicesCreated])
	require.Equal(t, w.count(t, `select count(*) from bill_run_batches where period = $1`, period.String()), res.Counts[billrun.CountPeriodBatches])
	require.Equal(t, w.count(t, `select count(*) from invoices where period = $1 and bill_run_fence = $2`, period.String(), res.Fence),
		res.Counts[billrun.CountInvoicesCreated])
	require.Equal(t, billrun.StatusCompleted, statusOf(t, w).Status)
}

// replicaLogs formats the replicas' logs when printed (a failure message).
type replicaLogs []*replica

func (rs replicaLogs) String() string {
	var out strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&out, "\n%s:\n%s", r.id, r.logs())
	}
	return out.String()
}
