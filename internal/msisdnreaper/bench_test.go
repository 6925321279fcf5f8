package msisdnreaper

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// benchStale is the number of stale reservations each measurement frees
// (COORDINATOR_BENCH_REAPER_STALE, else def). As many other rows (free, valid
// holds, allocated) are interleaved with them, so the stale rows are
// scattered over the table's pages.
func benchStale(b *testing.B, def int) int {
	b.Helper()
	return benchCount(b, "COORDINATOR_BENCH_REAPER_STALE", def)
}

// benchCount reads a count from the environment variable env, else def.
func benchCount(b *testing.B, env string, def int) int {
	b.Helper()
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(b, err, env)
	return n
}

// freshPool empties the table and seeds it again, vacuumed and analyzed, with
// the timer stopped.
func freshPool(b *testing.B, pg *testenv.PG, stale int) {
	b.Helper()
	b.StopTimer()
	defer b.StartTimer()
	ctx := context.Background()
	_, err := pg.Pool.Exec(ctx, "truncate msisdn_pool")
	require.NoError(b, err)
	_, err = Seed(ctx, pg.Pool, SeedSpec{StaleReserved: stale, Free: stale / 2, ValidReserved: stale / 4, Allocated: stale / 4})
	require.NoError(b, err)
	_, err = pg.Pool.Exec(ctx, "vacuum (analyze) msisdn_pool")
	require.NoError(b, err)
	_, _ = pg.Pool.Exec(ctx, "checkpoint") // needs superuser; best effort
}

const sqlSingleUpdate = `
update msisdn_pool
   set state = 'FREE', reserved_until = null, reserved_by = null, updated_at = now()
 where state = 'RESERVED' and reserved_until < now()`

// singleUpdate frees every stale reservation with one statement and returns
// rows/s.
func singleUpdate(b *testing.B, pg *testenv.PG, stale int) float64 {
	b.Helper()
	t0 := time.Now()
	tag, err := pg.Pool.Exec(context.Background(), sqlSingleUpdate)
	took := time.Since(t0)
	require.NoError(b, err)
	require.Equal(b, int64(stale), tag.RowsAffected())
	return float64(stale) / took.Seconds()
}

// sweepOnce frees every stale reservation with a Sweeper and returns rows/s.
func sweepOnce(b *testing.B, pg *testenv.PG, stale int, cfg Config) float64 {
	b.Helper()
	cfg.Lease = 10 * time.Minute
	s := NewTestSweeper(pg.Pool, memLocker(b, "bench", time.Second), events.Multi{}, cfg)
	t0 := time.Now()
	res := s.Sweep(context.Background(), job.Trigger{Source: job.SourceCLI, RequestID: "bench"})
	took := time.Since(t0)
	require.Equal(b, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(b, int64(stale), res.Counts["freed"])
	return float64(stale) / took.Seconds()
}

// BenchmarkSweepVsSingleUpdate frees the same stale reservations twice per
// iteration, on the same Postgres in the same run: once with one UPDATE, once
// with the default Sweeper (batches of 1000, 2 workers). It reports the mean
// rates and the median of the per-iteration ratios (target >= 0.7); pairing
// the two in each iteration keeps a busy machine's drift out of the ratio.
//
//	go test ./internal/msisdnreaper -run '^$' -bench SweepVsSingleUpdate -benchtime 3x -timeout 30m
func BenchmarkSweepVsSingleUpdate(b *testing.B) {
	pg := testenv.Postgres(b)
	stale := benchStale(b, 500_000)
	var single, sweep, ratios []float64
	for b.Loop() {
		freshPool(b, pg, stale)
		one := singleUpdate(b, pg, stale)
		freshPool(b, pg, stale)
		sw := sweepOnce(b, pg, stale, Config{})
		single, sweep, ratios = append(single, one), append(sweep, sw), append(ratios, sw/one)
	}
	b.ReportMetric(mean(single), "single_rows/s")
	b.ReportMetric(mean(sweep), "sweep_rows/s")
	b.ReportMetric(median(ratios), "ratio")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkSweepVariants measures batch size, workers and the scan (the
// msisdn cursor, no order, order by reserved_until) against one UPDATE. Each
// iteration is a round that runs every variant once on freshly seeded data,
// in a rotating order; each variant reports the median over rounds of its
// rows/s divided by the same round's single UPDATE.
//
// Default 100,000 stale reservations (COORDINATOR_BENCH_REAPER_STALE):
//
//	go test ./internal/msisdnreaper -run '^$' -bench SweepVariants -benchtime 3x -timeout 60m
func BenchmarkSweepVariants(b *testing.B) {
	pg := testenv.Postgres(b)
	stale := benchStale(b, 100_000)
	type variant struct {
		name           string
		batch, workers int
		scan           string
	}
	variants := []variant{{name: "single_update"}}
	for _, v := range []variant{
		{batch: 1000, workers: 1}, {batch: 1000, workers: 2}, {batch: 1000, workers: 4},
		{batch: 1000, workers: 1, scan: "unordered"}, {batch: 1000, workers: 2, scan: "unordered"},
		{batch: 1000, workers: 2, scan: "ordered"},
		{batch: 500, workers: 2}, {batch: 2000, workers: 2}, {batch: 5000, workers: 2},
	} {
		v.name = fmt.Sprintf("%s_b%d_w%d", cmp.Or(v.scan, "cursor"), v.batch, v.workers)
		variants = append(variants, v)
	}
	ratios := map[string][]float64{}
	rates := map[string][]float64{}
	round := 0
	for b.Loop() {
		rate := map[string]float64{}
		for i := range variants {
			v := variants[(i+round)%len(variants)]
			freshPool(b, pg, stale)
			if v.name == "single_update" {
				rate[v.name] = singleUpdate(b, pg, stale)
			} else {
				rate[v.name] = sweepOnce(b, pg, stale, Config{BatchSize: v.batch, Workers: v.workers, scan: v.scan})
			}
		}
		for name, r := range rate {
			rates[name] = append(rates[name], r)
			ratios[name] = append(ratios[name], r/rate["single_update"])
		}
		round++
	}
	for _, v := range variants {
		b.ReportMetric(median(rates[v.name]), v.name+"_rows/s")
		if v.name != "single_update" {
			b.ReportMetric(median(ratios[v.name]), v.name+"_ratio")
		}
	}
	b.ReportMetric(0, "ns/op")
}

func mean(xs []float64) float64 {
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
