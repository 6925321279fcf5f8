package telemetry_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/telemetry"
	"github.com/telco-platform/coordinator/internal/telemetry/otlptest"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// The cost of tracing, measured side by side in one run: tracing off (as
// with no OTEL_* variable), on sampling 1% of new traces
// (parentbased_traceidratio 0.01) and on sampling all of them, each
// exporting for real (batch span processor, OTLP/HTTP protobuf) to an
// in-process receiver that decodes and counts what it gets. The variants
// take turns within each iteration, in a rotating order, so load from
// elsewhere on the machine hits them alike. Figures: BENCHMARKS.md.

type variant struct {
	name string
	tel  *telemetry.Provider
	exp  *countingExporter
}

// countingExporter counts the spans it hands to the OTLP exporter.
type countingExporter struct {
	sdktrace.SpanExporter
	n atomic.Int64
}

func (c *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	c.n.Add(int64(len(spans)))
	return c.SpanExporter.ExportSpans(ctx, spans)
}

// flush exports what v has buffered: each variant's slice is charged its
// own export.
func (v variant) flush(b *testing.B) {
	if v.exp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(b, v.tel.ForceFlush(ctx))
}

func (v variant) spans() int64 {
	if v.exp == nil {
		return 0
	}
	return v.exp.n.Load()
}

func traced(b *testing.B, ratio float64) (*telemetry.Provider, *countingExporter) {
	b.Helper()
	rcv := otlptest.Start(b)
	rcv.Discard()
	otlp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(rcv.HTTPEndpoint()+"/v1/traces"))
	require.NoError(b, err)
	exp := &countingExporter{SpanExporter: otlp}
	tel := telemetry.NewForTest(sdktrace.NewBatchSpanProcessor(exp), sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)))
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = tel.Shutdown(ctx)
	})
	return tel, exp
}

func variants(b *testing.B) []variant {
	one, e1 := traced(b, 0.01)
	all, e100 := traced(b, 1)
	zero, e0 := traced(b, 0)
	return []variant{{"off", telemetry.Off(), nil}, {"p0", zero, e0}, {"p1", one, e1}, {"p100", all, e100}}
}

// rotate is the variants' order in iteration i.
func rotate(vs []variant, i int) []variant {
	k := i % len(vs)
	return append(append([]variant(nil), vs[k:]...), vs[:k]...)
}

// BenchmarkTracingAcquireRelease: owned runs with no work on the Redis lock
// (acquire, three events, release) through the template; with tracing on,
// the run, lock.acquire, lock.release and event spans and redisotel's span
// per Redis command. One op is one run of each variant. Reports µs per run
// of each, their ratios to off, and spans exported per run.
func BenchmarkTracingAcquireRelease(b *testing.B) {
	for _, g := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) {
			env := testenv.Redis(b)
			vs := variants(b)
			w := &ownedtest.Widget{}
			reg, err := owned.NewRegistry(w.Kind())
			require.NoError(b, err)
			runners := map[string]*owned.Runner{}
			for _, v := range vs {
				client, err := redislock.NewClient(env.URL, redislock.ModeSingle)
				require.NoError(b, err)
				require.NoError(b, v.tel.InstrumentRedis(client))
				l, err := redislock.New(client, redislock.Config{Prefix: env.Prefix + ":" + v.name, Owner: "bench", WaitTime: 30 * time.Second})
				require.NoError(b, err)
				b.Cleanup(func() { _ = l.Close(); _ = client.Close() })
				runners[v.name], err = owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{Locker: l}, Replica: "bench",
					Tracer: v.tel.TracerIfOn(owned.TracerName), Emit: events.EmitterFunc(func(context.Context, events.Event) {})})
				require.NoError(b, err)
			}
			ctx := context.Background()
			run := func(name string, n int) time.Duration {
				var wg sync.WaitGroup
				start := time.Now()
				for i := range g {
					wg.Go(func() {
						for range n {
							if res := runners[name].Run(ctx, w.Kind(), w.Params(i+1), job.Trigger{Source: job.SourceCLI}); res.Outcome != job.OutcomeCompleted {
								b.Error(res.Outcome, res.Error)
								return
							}
						}
					})
				}
				wg.Wait()
				return time.Since(start)
			}
			for _, v := range vs {
				run(v.name, 5) // warm connections and script caches
				v.flush(b)
			}
			before := map[string]int64{}
			for _, v := range vs {
				before[v.name] = v.spans()
			}
			b.ResetTimer()
			took := map[string]time.Duration{}
			const slice = 50
			runs, i := 0, 0
			for done := 0; done < b.N; done += slice * g {
				n := min(slice, (b.N-done+g-1)/g)
				for _, v := range rotate(vs, i) {
					start := time.Now()
					run(v.name, n)
					v.flush(b)
					took[v.name] += time.Since(start)
				}
				runs += n * g
				i++
			}
			b.StopTimer()
			per := float64(runs) / float64(g) // µs below are wall time per run per goroutine
			for _, v := range vs {
				b.ReportMetric(took[v.name].Seconds()*1e6/per, v.name+"_us/run")
			}
			for _, v := range vs[1:] {
				b.ReportMetric(took[v.name].Seconds()/took["off"].Seconds(), v.name+"/off")
				b.ReportMetric(float64(v.spans()-before[v.name])/float64(runs), v.name+"_spans/run")
			}
		})
	}
}

// BenchmarkTracingBillRun: a whole bill run of
// COORDINATOR_BENCH_BILLRUN_SUBSCRIBERS subscribers (default 100000; the
// figures in BENCHMARKS.md use 1000000) with 4 workers and batches of 1000,
// once per variant per op (run it a multiple of 4 times: each variant goes
// first once per 4). With tracing on the pool has otelpgx (a span per
// query) and each batch is a billrun.batch span. Reports the rows/s of
// each, the time ratios to off, and the spans exported per run.
func BenchmarkTracingBillRun(b *testing.B) {
	n := int64(100000)
	if v := os.Getenv("COORDINATOR_BENCH_BILLRUN_SUBSCRIBERS"); v != "" {
		var err error
		n, err = strconv.ParseInt(v, 10, 64)
		require.NoError(b, err)
	}
	pg := testenv.Postgres(b)
	ctx := context.Background()
	period := billrun.Period{Year: 2026, Month: time.October}
	seeded, err := billrun.Seed(ctx, pg.Pool, billrun.SeedConfig{Subscribers: n, SuspendedRatio: 0.05, TerminatedRatio: 0.05,
		Usage: true, Period: period})
	require.NoError(b, err)
	_, err = pg.Pool.Exec(ctx, `vacuum analyze subscribers`)
	require.NoError(b, err)
	_, err = pg.Pool.Exec(ctx, `vacuum analyze usage_charges`)
	require.NoError(b, err)

	// The progress denominator's count, alone: every variant pays it.
	start := time.Now()
	_, err = billrun.CountToPlan(ctx, pg.Pool, period, period.Start(time.UTC), period.End(time.UTC), time.Now(), 0)
	require.NoError(b, err)
	countTook := time.Since(start)

	vs := variants(b)
	k := billrun.New(billrun.Config{Workers: 4, BatchSize: 1000})
	reg, err := owned.NewRegistry(k)
	require.NoError(b, err)
	runners := map[string]*owned.Runner{}
	for _, v := range vs {
		pool, err := postgres.Connect(ctx, pg.DSN, 12, postgres.WithTracer(v.tel.PgxTracer()))
		require.NoError(b, err)
		b.Cleanup(pool.Close)
		l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "bench"})
		b.Cleanup(func() { _ = l.Close() })
		runners[v.name], err = owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: pool, Locker: l},
			Tracer: v.tel.TracerIfOn(owned.TracerName), Emit: events.EmitterFunc(func(context.Context, events.Event) {})})
		require.NoError(b, err)
	}
	one := func(name string) time.Duration {
		_, err := pg.Pool.Exec(ctx, `truncate invoices, bill_run_batches, bill_run_adjustments, bill_run_totals, bill_runs`)
		require.NoError(b, err)
		_, err = pg.Pool.Exec(ctx, `checkpoint`)
		require.NoError(b, err)
		start := time.Now()
		p, err := owned.NewParams(k, billrun.Request{Period: period})
		require.NoError(b, err)
		res := runners[name].Run(ctx, k, p, job.Trigger{Source: job.SourceCLI})
		flushOf(vs, name, b)
		d := time.Since(start)
		require.Equal(b, job.OutcomeCompleted, res.Outcome, res.Error)
		require.Equal(b, seeded.Active, res.Counts["invoices_created"])
		return d
	}
	// One untimed run first: the first run after seeding pays for cold
	// caches and the fresh tables' autovacuum.
	one("off")
	b.ResetTimer()
	took := map[string]time.Duration{}
	i := 0
	for b.Loop() {
		for _, v := range rotate(vs, i) {
			took[v.name] += one(v.name)
		}
		i++
	}
	b.StopTimer()
	b.ReportMetric(float64(seeded.Active), "subscribers")
	b.ReportMetric(countTook.Seconds()*1e3, "count_ms")
	for _, v := range vs {
		b.ReportMetric(float64(seeded.Active)*float64(i)/took[v.name].Seconds(), v.name+"_rows/s")
	}
	for _, v := range vs[1:] {
		b.ReportMetric(took[v.name].Seconds()/took["off"].Seconds(), v.name+"/off")
		b.ReportMetric(float64(v.spans())/float64(i), v.name+"_spans/run")
	}
}

func flushOf(vs []variant, name string, b *testing.B) {
	for _, v := range vs {
		if v.name == name {
			v.flush(b)
		}
	}
}
