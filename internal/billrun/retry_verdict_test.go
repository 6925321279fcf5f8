package billrun_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
)

// A completion that finds its fence superseded (a newer claim took the row
// right after the run's last batch committed) is lost at once: the fence
// check's answer does not change by asking again. (Before, the completion
// took "fence superseded" for a transient error and asked again every
// second for its whole 5-minute bound, and only then ended lost.)
func TestASupersededCompletionEndsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.insertSubs(t, period, []sub{{id: 1, status: "ACTIVE", fee: 1000}, {id: 2, status: "ACTIVE", fee: 1000}})
	// The last batch's record moves the fence on in the batch's own
	// transaction: once it commits, the row is a newer claim's.
	_, err := b.pool.Exec(ctx, `
		create function supersede() returns trigger language plpgsql as $$
		begin update bill_runs set fence = fence + 1, owner = 'replica-b' where period = new.period; return new; end $$;
		create trigger supersede after insert on bill_run_batches for each row when (new.last_id = 2) execute function supersede()`)
	require.NoError(t, err)
	retries := &logRecorder{msg: "billrun_retry"}
	reg := prometheus.NewRegistry()
	res := b.runner(billrun.Config{BatchSize: 1, Workers: 1, Metrics: billrun.NewMetrics(reg), Logger: slog.New(retries)}).Run(ctx, period, trig())
	require.Equal(t, job.OutcomeLost, res.Outcome, res.Error)
	require.Zero(t, len(retries.records()), "nothing to retry")
	require.Equal(t, int64(2), b.count(t, `select count(*) from invoices where period = $1`, period.String()))
	require.Equal(t, billrun.StatusRunning, b.text(t, `select status from bill_runs where period = $1`, period.String()), "the newer claim's row is left alone")
}

// A gap that the repair leaves open without an error (an insert a trigger
// of another team drops silently) is not completed, and pages, at once: a
// second reconcile of the same rows finds the same gap. (Before, the
// completion took it for a transient error and reconciled again every
// second for 5 minutes before it failed the run.)
func TestASilentlyDroppedRepairPagesAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.insertSubs(t, period, []sub{{id: 1, status: "ACTIVE", fee: 1000}, {id: 2, status: "ACTIVE", fee: 1000}})
	var n atomic.Int64
	hook := func(ctx context.Context, _, _ int64) error {
		if n.Add(1) != 2 {
			return nil
		}
		_, err := b.pool.Exec(ctx, `
			delete from invoices where period = '`+period.String()+`' and subscriber_id = 1;
			create function drop_invoice() returns trigger language plpgsql as $$ begin return null; end $$;
			create trigger drop_invoice before insert on invoices for each row when (new.subscriber_id = 1) execute function drop_invoice()`)
		return err
	}
	retries := &logRecorder{msg: "billrun_retry"}
	reg := prometheus.NewRegistry()
	res := b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 1, Workers: 1, Metrics: billrun.NewMetrics(reg), Logger: slog.New(retries)}, hook)).
		Run(ctx, period, trig())
	require.Equal(t, job.OutcomeFailed, res.Outcome, res.Error)
	require.True(t, res.Retryable, "the resumer retries it")
	require.Contains(t, res.Error, "1 subscriber(s) of the population still have no invoice")
	require.Equal(t, 1.0, value(t, reg, "coordinator_billrun_reconcile_failures_total", ""))
	require.Equal(t, 1.0, value(t, reg, "coordinator_billrun_reconcile_seconds", ""), "one reconcile")
	require.Zero(t, len(retries.records()), "nothing to retry")
}
