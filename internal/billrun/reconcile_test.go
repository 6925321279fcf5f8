package billrun_test

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
)

// logRecorder keeps the records a runner logs with message msg.
type logRecorder struct {
	msg  string
	mu   sync.Mutex
	recs []map[string]slog.Value
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	if r.Message != h.msg {
		return nil
	}
	m := map[string]slog.Value{}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value; return true })
	h.mu.Lock()
	h.recs = append(h.recs, m)
	h.mu.Unlock()
	return nil
}

func (h *logRecorder) records() []map[string]slog.Value {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]map[string]slog.Value(nil), h.recs...)
}

// loseBatches deletes the invoices and records of the period's committed
// batches number from..to (1-based, in id order), as a Postgres that lost
// their commits would have them, and returns their id ranges and
// subscribers.
func (b *bundle) loseBatches(ctx context.Context, p billrun.Period, from, to int) (ranges [][2]int64, subscribers int64, err error) {
	rows, err := b.pool.Query(ctx, `select first_id, last_id, subscribers from bill_run_batches where period = $1 order by first_id offset $2 limit $3`,
		p.String(), from-1, to-from+1)
	if err != nil {
		return nil, 0, err
	}
	for rows.Next() {
		var r [2]int64
		var n int64
		if err := rows.Scan(&r[0], &r[1], &n); err != nil {
			return nil, 0, err
		}
		ranges, subscribers = append(ranges, r), subscribers+n
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	for _, r := range ranges {
		if _, err := b.pool.Exec(ctx, `delete from invoices where period = $1 and subscriber_id between $2 and $3`, p.String(), r[0], r[1]); err != nil {
			return nil, 0, err
		}
		if _, err := b.pool.Exec(ctx, `delete from bill_run_batches where period = $1 and first_id = $2`, p.String(), r[0]); err != nil {
			return nil, 0, err
		}
	}
	return ranges, subscribers, nil
}

// Committed batches vanish behind the run's back (their invoices and
// records deleted while it runs, as a Postgres that lost acknowledged
// commits would have them): the completion finds their subscribers
// missing, bills them under its fence before it is COMPLETED, and says so:
// repaired in run.completed, in bill_runs and the status, the metric, and
// a log line with the id ranges. run.completed's counts are the
// database's: batches_committed leaves out the three lost batches the run
// saw commit. (Before, the run ended COMPLETED with the two batches'
// subscribers unbilled.)
func TestCompletionRepairsCommitsLostBehindTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seeded := b.seed(t, billrun.SeedConfig{Subscribers: 600, SuspendedRatio: 0.1, Usage: true})
	ctx := context.Background()

	var (
		n        atomic.Int64
		lost     [][2]int64
		lostSubs int64
	)
	hook := func(ctx context.Context, _, _ int64) error {
		if n.Add(1) != 7 { // batches 1-6 committed
			return nil
		}
		var err error
		if lost, lostSubs, err = b.loseBatches(ctx, period, 2, 3); err != nil {
			return err
		}
		// Batch 5 (the third left): a second range.
		more, subs, err := b.loseBatches(ctx, period, 3, 3)
		lost, lostSubs = append(lost, more...), lostSubs+subs
		return err
	}
	reg := prometheus.NewRegistry()
	logs := &logRecorder{msg: "billrun_repaired"}
	r := b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 50, Workers: 1, Metrics: billrun.NewMetrics(reg),
		Logger: slog.New(logs)}, hook))
	res := r.Run(ctx, period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Len(t, lost, 3)
	b.requireExactlyOnce(t, period)

	batches := (seeded.Active + 49) / 50
	require.Equal(t, lostSubs, res.Counts[billrun.CountRepaired])
	require.Equal(t, seeded.Active, res.Counts[billrun.CountPopulation])
	require.Equal(t, batches-3, res.Counts[billrun.CountBatchesCommitted], "from the database, not the run's memory (which saw %d commit)", batches)
	require.Equal(t, batches-3, b.count(t, `select count(*) from bill_run_batches where period = $1`, period.String()))
	require.Equal(t, seeded.Active, res.Counts[billrun.CountInvoicesCreated], "the batches' invoices and the repair's")
	require.Equal(t, seeded.Active, res.Counts[billrun.CountSubscribers])
	require.Equal(t, seeded.Active, res.Counts[billrun.CountPeriodInvoicesCreated])
	require.Equal(t, lostSubs, b.count(t, `select count(*) from invoices where period = $1 and bill_run_fence = 1
		and (subscriber_id between $2 and $3 or subscriber_id between $4 and $5)`,
		period.String(), lost[0][0], lost[1][1], lost[2][0], lost[2][1]), "billed under the run's fence")

	done := b.rec.OfType(events.RunCompleted)
	require.Len(t, done, 1)
	require.EqualValues(t, lostSubs, done[0].Extra[billrun.CountRepaired])
	require.EqualValues(t, seeded.Active, done[0].Extra[billrun.CountPopulation])
	require.Equal(t, false, done[0].Extra[billrun.DataEmptyPopulation])

	st, err := r.Status(ctx, period)
	require.NoError(t, err)
	require.Equal(t, billrun.StatusCompleted, st.Status)
	require.Equal(t, lostSubs, st.Counts[billrun.CountRepaired])
	require.Equal(t, seeded.Active, st.Counts[billrun.CountPopulation])
	require.Equal(t, seeded.Active, st.Counts[billrun.CountInvoicesCreated])

	require.Equal(t, float64(lostSubs), value(t, reg, "coordinator_billrun_repaired_subscribers_total", ""))
	require.Equal(t, 0.0, value(t, reg, "coordinator_billrun_reconcile_failures_total", ""))
	require.Equal(t, 1.0, value(t, reg, "coordinator_billrun_reconcile_seconds", ""))

	// Batches 2 and 3 were neighbours: one range, from the first's first id
	// to the second's last; batch 5 another.
	recs := logs.records()
	require.Len(t, recs, 1)
	require.EqualValues(t, 2, recs[0]["ranges"].Int64())
	require.Equal(t, []string{formatRange(lost[0][0], lost[1][1]), formatRange(lost[2][0], lost[2][1])}, recs[0]["first_ranges"].Any())

	// Nothing left for the next trigger.
	again := r.Run(ctx, period, trig())
	require.Equal(t, job.OutcomeAlreadyCompleted, again.Outcome, again.Error)
	require.Equal(t, lostSubs, again.Counts[billrun.CountRepaired])
}

// A gap the completion cannot close (the repair's inserts are refused) is
// not COMPLETED: the run is FAILED, a retryable failure recorded for the
// resumer, counted by the metric that pages; nothing of the repair stays.
// Once the cause is gone, the resumer's retry completes the period with
// every subscriber invoiced once. (Before, the run ended COMPLETED with
// the batch's subscribers unbilled.)
func TestUnrepairableGapIsNotCompleted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 300, SuspendedRatio: 0.1})
	ctx := context.Background()
	var (
		n    atomic.Int64
		lost [][2]int64
	)
	hook := func(ctx context.Context, _, _ int64) error {
		if n.Add(1) != 4 {
			return nil
		}
		var err error
		if lost, _, err = b.loseBatches(ctx, period, 1, 1); err != nil {
			return err
		}
		// Whatever refuses the lost subscribers' invoices now (a trigger of
		// another team, a constraint): the repair cannot bill them.
		_, err = b.pool.Exec(ctx, `
			create function refuse_invoice() returns trigger language plpgsql as $$
			begin raise exception 'invoice of subscriber % refused', new.subscriber_id; end $$;
			create trigger refuse_invoice before insert on invoices for each row
			when (new.subscriber_id between `+formatInt(lost[0][0])+` and `+formatInt(lost[0][1])+`) execute function refuse_invoice()`)
		return err
	}
	reg := prometheus.NewRegistry()
	r := b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 50, Workers: 1, Metrics: billrun.NewMetrics(reg)}, hook))
	res := r.Run(ctx, period, trig())
	require.Equal(t, job.OutcomeFailed, res.Outcome)
	require.True(t, res.Retryable, "the resumer retries it")
	require.Contains(t, res.Error, "not completed")
	require.Contains(t, res.Error, "refused")
	require.Equal(t, 1.0, value(t, reg, "coordinator_billrun_reconcile_failures_total", ""))
	require.Equal(t, 0.0, value(t, reg, "coordinator_billrun_repaired_subscribers_total", ""))

	st, err := r.Status(ctx, period)
	require.NoError(t, err)
	require.Equal(t, billrun.StatusFailed, st.Status)
	require.Equal(t, res.Error, st.LastError)
	require.Equal(t, int64(0), st.Counts[billrun.CountRepaired])
	require.Equal(t, int64(0), b.count(t, `select count(*) from invoices where period = $1 and subscriber_id between $2 and $3`,
		period.String(), lost[0][0], lost[0][1]), "the repair rolled back whole")
	failed := b.rec.OfType(events.RunFailed)
	require.Len(t, failed, 1)
	require.Equal(t, true, failed[0].Extra["retryable"])
	require.Equal(t, int64(1), b.count(t, `select count(*) from run_requests where job = 'billrun' and run_key = $1 and not permanent and last_outcome = 'failed'`,
		billrun.LockKey(period)), "recorded for the resumer")

	_, err = b.pool.Exec(ctx, `drop trigger refuse_invoice on invoices`)
	require.NoError(t, err)
	scanOnce(t, b.runner(billrun.Config{BatchSize: 50}).template, time.Hour)
	st, err = r.Status(ctx, period)
	require.NoError(t, err)
	require.Equal(t, billrun.StatusCompleted, st.Status, st.LastError)
	b.requireExactlyOnce(t, period)
	require.Equal(t, int64(0), b.count(t, `select count(*) from run_requests where job = 'billrun'`), "the request is done")
}

// A period with nobody to bill completes and says so: empty_population in
// run.completed, population 0, and the metric.
func TestEmptyPopulationCompletesSayingSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertSubs(t, period, []sub{{id: 1, status: "SUSPENDED", fee: 1000}, {id: 2, status: "ACTIVE", fee: 1000, activated: at(period.End(time.UTC))}})
	reg := prometheus.NewRegistry()
	res := b.runner(billrun.Config{Metrics: billrun.NewMetrics(reg)}).Run(context.Background(), period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(0), res.Counts[billrun.CountPopulation])
	done := b.rec.OfType(events.RunCompleted)
	require.Len(t, done, 1)
	require.Equal(t, true, done[0].Extra[billrun.DataEmptyPopulation])
	require.EqualValues(t, 0, done[0].Extra[billrun.CountPopulation])
	require.Equal(t, 1.0, value(t, reg, "coordinator_billrun_empty_populations_total", ""))
}

func formatInt(n int64) string { return strconv.FormatInt(n, 10) }

func formatRange(first, last int64) string { return formatInt(first) + "-" + formatInt(last) }

// Subscribers of a COMPLETED period that have no invoice (one loaded after
// the bill run's cutoff, one backdated into the period after it) are
// reported by the late-usage check and billed by an adjustment run, with
// the bill run's amounts, under the adjustment's fence, exactly once.
// (Before, an adjustment run billed late usage only, and these subscribers
// could never be billed.)
func TestAdjustmentBillsSubscribersWithoutInvoice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	p := period
	day := func(d int) time.Time { return time.Date(p.Year, p.Month, d, 0, 0, 0, 0, time.UTC) }
	subs := []sub{
		{id: 1, status: "ACTIVE", fee: 1000, usage: 10},
		{id: 2, status: "ACTIVE", fee: 3000, activated: at(p.End(time.UTC).Add(48 * time.Hour))}, // not in it (yet)
	}
	b.insertSubs(t, p, subs)
	r := b.runner(billrun.Config{})
	res := r.Run(ctx, p, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(1), res.Counts[billrun.CountPopulation])

	// Backdated: subscriber 2 was active from the 11th. Loaded late:
	// subscriber 3, created after the cutoff, active all month, with usage.
	subs[1].activated = at(day(11))
	_, err := b.pool.Exec(ctx, `update subscribers set activated_at = $1 where id = 2`, *subs[1].activated)
	require.NoError(t, err)
	late := sub{id: 3, status: "ACTIVE", fee: 500, usage: 70}
	b.insertSubs(t, p, []sub{late})
	subs = append(subs, late)

	res = r.Run(ctx, p, trig())
	require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(2), res.Counts[billrun.CountUnbilledSubscribers])
	lu := b.rec.OfType(events.BillrunLateUsage)
	require.Len(t, lu, 1)
	require.EqualValues(t, 2, lu[0].Extra[billrun.CountUnbilledSubscribers])

	adjust := func() job.Result {
		return r.template.Run(ctx, r.kind, params(r.kind, billrun.Request{Period: p, Adjust: true}), trig())
	}
	res = adjust()
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(2), res.Counts[billrun.CountInvoicesCreated])
	require.Equal(t, int64(0), res.Counts[billrun.CountAdjustmentsCreated], "the new invoices carry their usage")
	require.Equal(t, int64(0), res.Counts[billrun.CountUnbilledSubscribers])
	b.requireInvoices(t, p, time.UTC, subs)
	want2, _ := wantInvoice(subs[1], p, time.UTC)
	want3, _ := wantInvoice(late, p, time.UTC)
	require.Equal(t, want2+want3, res.Counts[billrun.CountInvoicedCents])
	require.Equal(t, int64(2), b.count(t, `select count(*) from invoices where period = $1 and adjust_fence = 1 and bill_run_fence is null`, p.String()))

	res = adjust()
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(0), res.Counts[billrun.CountInvoicesCreated], "billed once")
	require.Equal(t, int64(3), b.count(t, `select count(*) from invoices where period = $1`, p.String()))
	st, err := r.Status(ctx, p)
	require.NoError(t, err)
	require.Equal(t, int64(2), st.Adjustments.InvoicesCreated)
}
