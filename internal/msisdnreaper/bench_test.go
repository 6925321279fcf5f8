package msisdnreaper

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// benchStale is the number of stale reservations each measurement frees
// (COORDINATOR_BENCH_REAPER_STALE, default 500000). As many other rows (free,
// valid holds, allocated) are interleaved with them, so the stale rows are
// scattered over the table's pages.
func benchStale(b *testing.B) int {
	b.Helper()
	n := 500_000
	if v := os.Getenv("COORDINATOR_BENCH_REAPER_STALE"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(b, err, "COORDINATOR_BENCH_REAPER_STALE")
	}
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
	cfg.ReplicaID = "bench"
	cfg.Lease = 10 * time.Minute
	s := NewSweeper(pg.Pool, memLocker(b, "bench", time.Second), events.Multi{}, cfg)
	t0 := time.Now()
	res := s.Sweep(context.Background(), job.Trigger{Source: job.SourceCLI, RequestID: "bench"})
	took := time.Since(t0)
	require.Equal(b, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(b, int64(stale), res.Counts["freed"])
	return float64(stale) / took.Seconds()
}

// BenchmarkSweepVsSingleUpdate frees the same stale reservations twice per
// iteration, on the same Postgres in the same run: once with one UPDATE, once
// with the default Sweeper (batches of 1000, 2 workers). It reports both
// rates and their ratio (target >= 0.7).
//
//	go test ./internal/msisdnreaper -run '^$' -bench SweepVsSingleUpdate -benchtime 3x
func BenchmarkSweepVsSingleUpdate(b *testing.B) {
	pg := testenv.Postgres(b)
	stale := benchStale(b)
	var single, sweep float64
	for b.Loop() {
		freshPool(b, pg, stale)
		single += singleUpdate(b, pg, stale)
		freshPool(b, pg, stale)
		sweep += sweepOnce(b, pg, stale, Config{})
	}
	b.ReportMetric(single/float64(b.N), "single_rows/s")
	b.ReportMetric(sweep/float64(b.N), "sweep_rows/s")
	b.ReportMetric(sweep/single, "ratio")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkSweepVariants measures batch size, workers and the scan (the
// msisdn cursor, no order, order by reserved_until), each on freshly seeded
// data. Select some with -bench 'SweepVariants/scan=cursor'.
//
//	go test ./internal/msisdnreaper -run '^$' -bench SweepVariants -benchtime 2x
func BenchmarkSweepVariants(b *testing.B) {
	pg := testenv.Postgres(b)
	stale := benchStale(b)
	b.Run("single_update", func(b *testing.B) {
		var rate float64
		for b.Loop() {
			freshPool(b, pg, stale)
			rate += singleUpdate(b, pg, stale)
		}
		b.ReportMetric(rate/float64(b.N), "rows/s")
		b.ReportMetric(0, "ns/op")
	})
	for _, v := range []struct {
		batch, workers int
		scan           string
	}{
		{1000, 1, ""}, {1000, 2, ""}, {1000, 4, ""},
		{1000, 1, "unordered"}, {1000, 2, "unordered"},
		{1000, 2, "ordered"},
		{500, 2, ""}, {2000, 2, ""}, {5000, 2, ""},
	} {
		name := fmt.Sprintf("scan=%s/batch=%d/workers=%d", cmp.Or(v.scan, "cursor"), v.batch, v.workers)
		b.Run(name, func(b *testing.B) {
			var rate float64
			for b.Loop() {
				freshPool(b, pg, stale)
				rate += sweepOnce(b, pg, stale, Config{BatchSize: v.batch, Workers: v.workers, scan: v.scan})
			}
			b.ReportMetric(rate/float64(b.N), "rows/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}
