package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The owner replica killed mid-run: once the watchdog timeout has passed,
// another replica resumes the run from the committed batches (its resumer
// finds the period RUNNING with the lock free, or the trigger, whose offset
// was never committed, is redelivered) and completes it.
func TestOwnerKilledMidRunAnotherResumes(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, "")
	period := monthsAgo(5)
	key := "billrun:" + period
	d.seedSubscribers(3000, period)
	// 26 batches at 1 s over 4 workers: seconds of run to kill into, also
	// when the test itself is starved on a loaded machine.
	rs := d.startReplicas(3, map[string]string{
		"COORDINATOR_TEST_BILLRUN_BATCH_DELAY": "1s",
		"COORDINATOR_LOCK_WATCHDOG_TIMEOUT":    "2s",
	}, "--reaper-schedule=")

	partition, offset := d.produce(d.bills, period, billRunTrigger(period, "kill-me"))
	acquired := d.events.waitFor(t, 30*time.Second, 1, "ownership.acquired", ofType("ownership.acquired", key))
	first := acquired[0].str("replica")

	// Kill the owner once it has committed some batches, not all.
	ctx := context.Background()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var batches int
		require.NoError(c, d.pg.Pool.QueryRow(ctx, `select count(*) from bill_run_batches where period = $1`, period).Scan(&batches))
		require.Positive(c, batches, "batches committed")
	}, 20*time.Second, 20*time.Millisecond)
	for _, r := range rs {
		if r.id == first {
			r.kill()
		}
	}
	killedAt := time.Now()
	var status string
	require.NoError(t, d.pg.Pool.QueryRow(ctx, `select status from bill_runs where period = $1`, period).Scan(&status))
	require.Equal(t, "RUNNING", status, "killed mid-run")
	var total, batches int
	require.NoError(t, d.pg.Pool.QueryRow(ctx, `select (count(*) + 99) / 100 from subscribers where status = 'ACTIVE'`).Scan(&total))
	require.NoError(t, d.pg.Pool.QueryRow(ctx, `select count(*) from bill_run_batches where period = $1`, period).Scan(&batches))
	require.Less(t, batches, total, "killed before the last batch")
	require.LessOrEqual(t, d.committed(d.bills, partition), offset, "the in-flight trigger was not committed")

	done := d.events.waitFor(t, 60*time.Second, 1, "run.completed", ofType("run.completed", key))
	resumer := done[0].str("replica")
	require.NotEqual(t, first, resumer)
	require.Equal(t, "kill-me", done[0].str("request_id"), "the redelivered trigger")
	require.Greater(t, done[0].num("batches_skipped"), int64(0), "resumed from the committed batches")
	t.Logf("killed %s at %d committed batches; %s resumed and completed %s after the kill",
		first, batches, resumer, done[0].Time.Sub(killedAt).Round(time.Millisecond))

	d.requireInvoicesExact(period)
	var owner string
	var fence int64
	require.NoError(t, d.pg.Pool.QueryRow(ctx, `select status, owner, fence from bill_runs where period = $1`, period).Scan(&status, &owner, &fence))
	require.Equal(t, "COMPLETED", status)
	require.Equal(t, resumer, owner)
	require.EqualValues(t, 2, fence, "claimed twice")
	// The trigger, redelivered once the session timeout moved its
	// partition, finds the period completed (already_completed) and is
	// committed.
	d.waitCommitted(d.bills, partition, offset+1, 40*time.Second)
}
