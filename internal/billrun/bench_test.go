package billrun_test

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// Benchmark variables (the 1M figure is opt-in: seeding and billing it takes
// a minute or two).
const (
	envBenchSubscribers = "COORDINATOR_BENCH_BILLRUN_SUBSCRIBERS" // default 100000
	envBenchWorkers     = "COORDINATOR_BENCH_BILLRUN_WORKERS"     // default "1,2,4,8" for the sweep
	envBenchBatchSizes  = "COORDINATOR_BENCH_BILLRUN_BATCH_SIZES" // default "1000" for the sweep
)

// sqlSingleStatement is the floor: the same invoices as a bill run from
// one INSERT ... SELECT (testdata/single_statement.sql, which
// bench/billrun-rss runs too).
//
//go:embed testdata/single_statement.sql
var sqlSingleStatement string

// sqlLegacySingleStatement is the floor as issue 4 first named it, before
// periods had a population cutoff and proration: every ACTIVE subscriber,
// the full fee plus usage. Reported beside the floor to show what the
// billing semantics cost.
const sqlLegacySingleStatement = `
insert into invoices (subscriber_id, period, amount_cents, bill_run_fence)
select s.id, $1, s.monthly_fee_cents + coalesce(u.total, 0), 0
from subscribers s
left join (select subscriber_id, sum(amount_cents) as total
           from usage_charges where period = $1 group by subscriber_id) u on u.subscriber_id = s.id
where s.status = 'ACTIVE'
on conflict (subscriber_id, period) do nothing`

func envInts(b *testing.B, name, def string) []int {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	var out []int
	for _, f := range splitComma(v) {
		n, err := strconv.Atoi(f)
		require.NoError(b, err, name)
		out = append(out, n)
	}
	return out
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

type benchEnv struct {
	b      *testing.B
	pg     *testenv.PG
	active int64
}

func newBenchEnv(b *testing.B) *benchEnv {
	n := envInts(b, envBenchSubscribers, "100000")[0]
	pg := testenv.Postgres(b)
	ctx := context.Background()
	start := time.Now()
	seeded, err := billrun.Seed(ctx, pg.Pool, billrun.SeedConfig{Subscribers: int64(n), SuspendedRatio: 0.05, TerminatedRatio: 0.05, Usage: true, Period: period})
	require.NoError(b, err)
	_, err = pg.Pool.Exec(ctx, `vacuum analyze subscribers; `)
	require.NoError(b, err)
	_, err = pg.Pool.Exec(ctx, `vacuum analyze usage_charges`)
	require.NoError(b, err)
	b.Logf("seeded %d subscribers (%d ACTIVE, %d usage charges) in %s", seeded.Subscribers, seeded.Active, seeded.UsageCharges, time.Since(start).Round(time.Millisecond))
	return &benchEnv{b: b, pg: pg, active: seeded.Active}
}

// reset empties the outputs and checkpoints, so every timed part starts alike.
func (e *benchEnv) reset() {
	ctx := context.Background()
	_, err := e.pg.Pool.Exec(ctx, `truncate invoices, bill_run_batches, bill_run_adjustments, bill_run_totals, bill_runs`)
	require.NoError(e.b, err)
	_, err = e.pg.Pool.Exec(ctx, `checkpoint`)
	require.NoError(e.b, err)
}

func (e *benchEnv) singleStatement() time.Duration {
	e.reset()
	start, end := period.Start(time.UTC), period.End(time.UTC)
	var cutoff time.Time
	require.NoError(e.b, e.pg.Pool.QueryRow(context.Background(), `select clock_timestamp()`).Scan(&cutoff))
	t := time.Now()
	tag, err := e.pg.Pool.Exec(context.Background(), sqlSingleStatement, period.String(), start, end, cutoff, "UTC", period.Days())
	d := time.Since(t)
	require.NoError(e.b, err)
	require.Equal(e.b, e.active, tag.RowsAffected())
	return d
}

func (e *benchEnv) legacySingleStatement() time.Duration {
	e.reset()
	start := time.Now()
	tag, err := e.pg.Pool.Exec(context.Background(), sqlLegacySingleStatement, period.String())
	d := time.Since(start)
	require.NoError(e.b, err)
	require.Equal(e.b, e.active, tag.RowsAffected())
	return d
}

// runner bills the period once; zero workers or batch take the defaults.
func (e *benchEnv) runner(workers, batch int, reg *prometheus.Registry) time.Duration {
	e.reset()
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "bench"})
	defer l.Close()
	var m *billrun.Metrics
	if reg != nil {
		m = billrun.NewMetrics(reg)
	}
	r := newRunner(e.pg.Pool, l, "", events.EmitterFunc(func(context.Context, events.Event) {}),
		billrun.Config{Workers: workers, BatchSize: batch, Metrics: m})
	start := time.Now()
	res := r.Run(context.Background(), period, job.Trigger{Source: job.SourceCLI})
	d := time.Since(start)
	require.Equal(e.b, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(e.b, e.active, res.Counts["invoices_created"])
	return d
}

func rate(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() }

// BenchmarkBillRunVsSingleStatement invoices the same data four ways in
// each iteration, in turn, so all see the same machine: the single INSERT
// ... SELECT floor with the same semantics (one backend), the legacy floor
// (ACTIVE at full fee), the runner with the default configuration
// (DefaultWorkers, DefaultBatchSize) and the runner with 1 worker (one
// backend, like the floor). It reports the rates, the ratios to the floors,
// and where the default run's time goes per batch (summed over workers).
func BenchmarkBillRunVsSingleStatement(b *testing.B) {
	e := newBenchEnv(b)
	var floor, legacy, ours, ours1 time.Duration
	phases := map[string]float64{}
	batches := 0.0
	for b.Loop() {
		floor += e.singleStatement()
		legacy += e.legacySingleStatement()
		reg := prometheus.NewRegistry()
		ours += e.runner(0, 0, reg) // the defaults
		ours1 += e.runner(1, 0, nil)
		mfs, err := reg.Gather()
		require.NoError(b, err)
		for _, mf := range mfs {
			if mf.GetName() != "coordinator_billrun_batch_phase_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				phase := m.GetLabel()[0].GetValue()
				phases[phase] += m.GetHistogram().GetSampleSum()
				if phase == billrun.PhaseStatement {
					batches += float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	n := time.Duration(b.N)
	b.ReportMetric(float64(e.active), "subscribers")
	b.ReportMetric(rate(e.active, floor/n), "floor_rows/s")
	b.ReportMetric(rate(e.active, legacy/n), "legacy_floor_rows/s")
	b.ReportMetric(rate(e.active, ours/n), "default_rows/s")
	b.ReportMetric(rate(e.active, ours1/n), "w1_rows/s")
	b.ReportMetric(floor.Seconds()/ours.Seconds(), "default/floor")
	b.ReportMetric(legacy.Seconds()/ours.Seconds(), "default/legacy_floor")
	b.ReportMetric(floor.Seconds()/ours1.Seconds(), "w1/floor")
	for _, p := range []string{billrun.PhaseAcquire, billrun.PhaseVerify, billrun.PhaseStatement} {
		b.ReportMetric(phases[p]/batches*1e6, p+"_us/batch")
	}
}

// BenchmarkBillRunTuning sweeps workers and batch sizes (env lists).
func BenchmarkBillRunTuning(b *testing.B) {
	e := newBenchEnv(b)
	for _, batch := range envInts(b, envBenchBatchSizes, "1000") {
		for _, w := range envInts(b, envBenchWorkers, "1,2,4,8") {
			b.Run(fmt.Sprintf("batch=%d/workers=%d", batch, w), func(b *testing.B) {
				e.b = b
				var total time.Duration
				for b.Loop() {
					total += e.runner(w, batch, nil)
				}
				b.ReportMetric(rate(e.active, total/time.Duration(b.N)), "rows/s")
			})
		}
	}
}

// BenchmarkBillRunReconcile measures what proving completion costs (issue
// 23), in one session: a bill run with the default configuration and the
// time its completion spent reconciling (coordinator_billrun_reconcile_seconds);
// the same run without invoices_period_brin (what the index costs
// the batches' inserts); then, with two more periods of invoices in the
// table, the reconcile count alone on the billed period with and without
// the index (what it saves as invoices accumulate); and a run whose
// invoices of 1% of the subscribers billed by its middle are deleted behind
// its back, so its completion repairs them.
func BenchmarkBillRunReconcile(b *testing.B) {
	e := newBenchEnv(b)
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		_, err := e.pg.Pool.Exec(ctx, sql, args...)
		require.NoError(b, err)
	}
	const createIndex = `create index invoices_period_brin on invoices using brin (period) with (pages_per_range = 32, autosummarize = on)`
	sum := func(reg *prometheus.Registry, name string) float64 {
		mfs, err := reg.Gather()
		require.NoError(b, err)
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetHistogram().GetSampleSum()
			}
		}
		b.Fatalf("no %s", name)
		return 0
	}
	var run, runNoIndex, reconcile, countOnly, countNoIndex, repairRun, repair time.Duration
	var repaired int64
	for b.Loop() {
		reg := prometheus.NewRegistry()
		run += e.runner(0, 0, reg)
		reconcile += time.Duration(sum(reg, "coordinator_billrun_reconcile_seconds") * float64(time.Second))

		exec(`drop index invoices_period_brin`)
		runNoIndex += e.runner(0, 0, nil)
		exec(createIndex)

		// Two more periods of invoices beside the billed one (not timed).
		e.runner(0, 0, nil)
		var cutoff time.Time
		require.NoError(b, e.pg.Pool.QueryRow(ctx, `select cutoff_at from bill_runs where period = $1`, period.String()).Scan(&cutoff))
		for _, p := range []billrun.Period{period.Previous(), period.Previous().Previous()} {
			exec(`insert into invoices (subscriber_id, period, amount_cents) select subscriber_id, $1, amount_cents from invoices where period = $2`,
				p.String(), period.String())
		}
		exec(`vacuum analyze invoices`)
		start, end := period.Start(time.UTC), period.End(time.UTC)
		t := time.Now()
		pop, missing, err := billrun.Reconcile(ctx, e.pg.Pool, period, start, end, cutoff)
		countOnly += time.Since(t)
		require.NoError(b, err)
		require.Equal(b, e.active, pop)
		require.Zero(b, missing)
		exec(`drop index invoices_period_brin`)
		t = time.Now()
		_, _, err = billrun.Reconcile(ctx, e.pg.Pool, period, start, end, cutoff)
		countNoIndex += time.Since(t)
		require.NoError(b, err)
		exec(createIndex)

		// 1% of the subscribers billed by the run's middle deleted behind it.
		e.reset()
		reg = prometheus.NewRegistry()
		var once atomic.Bool
		l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "bench"})
		r := newRunner(e.pg.Pool, l, "", events.EmitterFunc(func(context.Context, events.Event) {}),
			billrun.WithBeforeBatch(billrun.Config{Metrics: billrun.NewMetrics(reg)}, func(ctx context.Context, first, _ int64) error {
				if first > e.active/2 && once.CompareAndSwap(false, true) {
					_, err := e.pg.Pool.Exec(ctx, `delete from invoices where period = $1 and subscriber_id % 100 = 7`, period.String())
					return err
				}
				return nil
			}))
		t = time.Now()
		res := r.Run(ctx, period, job.Trigger{Source: job.SourceCLI})
		repairRun += time.Since(t)
		_ = l.Close()
		require.Equal(b, job.OutcomeCompleted, res.Outcome, res.Error)
		require.Positive(b, res.Counts["repaired"])
		repaired += res.Counts["repaired"]
		repair += time.Duration(sum(reg, "coordinator_billrun_reconcile_seconds") * float64(time.Second))
	}
	n := time.Duration(b.N)
	ms := func(d time.Duration) float64 { return float64(d/n) / float64(time.Millisecond) }
	b.ReportMetric(float64(e.active), "subscribers")
	b.ReportMetric(ms(run), "run_ms")
	b.ReportMetric(ms(reconcile), "reconcile_ms")
	b.ReportMetric(reconcile.Seconds()/run.Seconds(), "reconcile/run")
	b.ReportMetric(ms(runNoIndex), "run_no_period_index_ms")
	b.ReportMetric(run.Seconds()/runNoIndex.Seconds(), "run/run_no_period_index")
	b.ReportMetric(ms(countOnly), "count_3_periods_ms")
	b.ReportMetric(ms(countNoIndex), "count_3_periods_no_index_ms")
	b.ReportMetric(float64(repaired)/float64(b.N), "repaired")
	b.ReportMetric(ms(repairRun), "run_with_repair_ms")
	b.ReportMetric(ms(repair), "reconcile_with_repair_ms")
}
