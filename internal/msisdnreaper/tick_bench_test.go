package msisdnreaper

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// tickVariant is one index set and batch statement of BenchmarkReaperTick,
// on a schema of its own.
type tickVariant struct {
	name string
	scan string
	// indexes turns the migrated schema into this variant's index set.
	indexes []string
	pg      *testenv.PG
}

// The index sets compared: the schema before migration 00010 (the msisdn
// walk), the same walk over a covering index (the suggestion), and
// the walk by expiry of migration 00010.
func tickVariants() []*tickVariant {
	old := []string{
		"drop index msisdn_pool_reserved_expiry",
		"create index msisdn_pool_reserved on msisdn_pool (msisdn) where state = 'RESERVED'",
		"create index msisdn_pool_stale_reservations on msisdn_pool (reserved_until) where state = 'RESERVED'",
	}
	covering := []string{
		"drop index msisdn_pool_reserved_expiry",
		"create index msisdn_pool_reserved_covering on msisdn_pool (msisdn) include (reserved_until) where state = 'RESERVED'",
		"create index msisdn_pool_stale_reservations on msisdn_pool (reserved_until) where state = 'RESERVED'",
	}
	return []*tickVariant{
		{name: "before_msisdn_walk", scan: "msisdn", indexes: old},
		{name: "covering_msisdn_walk", scan: "msisdn", indexes: covering},
		{name: "after_expiry_walk", scan: ""},
	}
}

// sqlRestale makes the rows a sweep freed stale reservations again, with
// expiries spread over the last day.
const sqlRestale = `
update msisdn_pool
   set state = 'RESERVED', reserved_by = 'seed',
       reserved_until = now() - (1 + (msisdn::bigint * 7919) % 86400) * interval '1 second'
 where state = 'FREE'`

// BenchmarkReaperTick: one reaper tick over a pool of 1,000,000 RESERVED
// rows of which 1% are stale (COORDINATOR_BENCH_REAPER_RESERVED and
// COORDINATOR_BENCH_REAPER_STALE change both), for each index set of
// tickVariants on a schema of its own, and one UPDATE freeing the same rows
// on the schema of migration 00010. Each iteration is a round that makes the
// freed rows stale again, vacuums, and then runs every variant's tick in a
// rotating order. Per variant it reports the median over rounds of:
//
//   - tick_ms: the sweep (the owned template with a memory locker, default
//     Config: batches of 1000, 2 workers) that frees the stale rows;
//   - idle_dirty_ms: a tick straight after it, with nothing stale, before
//     any vacuum (the freed rows' pages are not all-visible);
//   - idle_ms: the same after VACUUM.
//
// COORDINATOR_BENCH_REAPER_EXPLAIN=1 logs EXPLAIN (ANALYZE, BUFFERS) of the
// first batch statement of a sweep, and of an idle tick's before and after
// VACUUM, per variant (inside a rolled back transaction).
//
//	go test ./internal/msisdnreaper -run '^$' -bench ReaperTick -benchtime 3x -timeout 30m
func BenchmarkReaperTick(b *testing.B) {
	ctx := context.Background()
	reserved := benchCount(b, "COORDINATOR_BENCH_REAPER_RESERVED", 1_000_000)
	stale := benchCount(b, "COORDINATOR_BENCH_REAPER_STALE", reserved/100)
	explain := os.Getenv("COORDINATOR_BENCH_REAPER_EXPLAIN") == "1"
	variants := tickVariants()
	for _, v := range variants {
		v.pg = testenv.Postgres(b)
		for _, stmt := range v.indexes {
			_, err := v.pg.Pool.Exec(ctx, stmt)
			require.NoError(b, err, stmt)
		}
		_, err := Seed(ctx, v.pg.Pool, SeedSpec{StaleReserved: stale, ValidReserved: reserved - stale})
		require.NoError(b, err)
		_, err = v.pg.Pool.Exec(ctx, "vacuum (analyze) msisdn_pool")
		require.NoError(b, err)
	}
	after := variants[len(variants)-1]
	tick := func(v *tickVariant, want int64) time.Duration {
		s := NewTestSweeper(v.pg.Pool, memLocker(b, "bench", time.Second), events.Multi{}, Config{Lease: 10 * time.Minute, scan: v.scan})
		t0 := time.Now()
		res := s.Sweep(ctx, job.Trigger{Source: job.SourceCLI, RequestID: "bench"})
		took := time.Since(t0)
		require.Equal(b, job.OutcomeCompleted, res.Outcome, res.Error)
		require.Equal(b, want, res.Counts["freed"], v.name)
		return took
	}
	prepare := func(pg *testenv.PG) {
		_, err := pg.Pool.Exec(ctx, sqlRestale)
		require.NoError(b, err)
		_, err = pg.Pool.Exec(ctx, "vacuum (analyze) msisdn_pool")
		require.NoError(b, err)
		_, _ = pg.Pool.Exec(ctx, "checkpoint") // needs superuser; best effort
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	res := map[string]map[string][]float64{}
	var single []float64
	round := 0
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		for _, v := range variants {
			prepare(v.pg)
		}
		b.StartTimer()
		for i := range len(variants) + 1 {
			k := (i + round) % (len(variants) + 1)
			if k == len(variants) {
				b.StopTimer()
				prepare(after.pg)
				b.StartTimer()
				t0 := time.Now()
				tag, err := after.pg.Pool.Exec(ctx, sqlSingleUpdate)
				single = append(single, ms(time.Since(t0)))
				require.NoError(b, err)
				require.Equal(b, int64(stale), tag.RowsAffected())
				b.StopTimer()
				prepare(after.pg)
				b.StartTimer()
				continue
			}
			v := variants[k]
			if res[v.name] == nil {
				res[v.name] = map[string][]float64{}
			}
			r := res[v.name]
			if explain && round == 0 {
				logExplain(b, v, "first batch of a sweep (vacuumed)")
			}
			r["tick_ms"] = append(r["tick_ms"], ms(tick(v, int64(stale))))
			if explain && round == 0 {
				logExplain(b, v, "idle tick before vacuum")
			}
			r["idle_dirty_ms"] = append(r["idle_dirty_ms"], ms(tick(v, 0)))
			b.StopTimer()
			_, err := v.pg.Pool.Exec(ctx, "vacuum msisdn_pool")
			require.NoError(b, err)
			b.StartTimer()
			if explain && round == 0 {
				logExplain(b, v, "idle tick after vacuum")
			}
			r["idle_ms"] = append(r["idle_ms"], ms(tick(v, 0)))
		}
		round++
	}
	b.StopTimer()
	for _, v := range variants {
		for _, m := range []string{"tick_ms", "idle_dirty_ms", "idle_ms"} {
			b.ReportMetric(median(res[v.name][m]), v.name+"_"+m)
		}
	}
	b.ReportMetric(median(single), "single_update_ms")
	b.ReportMetric(0, "ns/op")
}

// logExplain logs EXPLAIN (ANALYZE, BUFFERS) of v's first batch statement
// (cursor at the start), rolled back, planned both ways the pool's prepared
// statements can be: with the parameters' values (a custom plan) and
// without (the generic plan Postgres switches to after five executions of a
// prepared statement when it looks no costlier).
func logExplain(b *testing.B, v *tickVariant, what string) {
	b.Helper()
	ctx := context.Background()
	sql := sqlSweepBatch
	if v.scan == "msisdn" {
		sql = sqlSweepBatchMsisdn
	}
	conn, err := v.pg.Pool.Acquire(ctx)
	require.NoError(b, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "prepare sweep_explain(int, timestamptz, text) as "+sql)
	require.NoError(b, err)
	defer func() { _, _ = conn.Exec(ctx, "deallocate sweep_explain") }()
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		tx, err := conn.Begin(ctx)
		require.NoError(b, err)
		_, err = tx.Exec(ctx, "set local plan_cache_mode = "+mode)
		require.NoError(b, err)
		rows, err := tx.Query(ctx, "explain (analyze, buffers, costs off, timing off) execute sweep_explain(1000, '-infinity', '')")
		require.NoError(b, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(b, err)
		require.NoError(b, tx.Rollback(ctx))
		b.Logf("%s, %s, %s:\n%s", v.name, what, mode, strings.Join(lines, "\n"))
	}
}
