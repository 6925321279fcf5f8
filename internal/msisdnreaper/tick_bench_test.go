package msisdnreaper

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// tickSchema is one index set of BenchmarkReaperTick, on a schema of its
// own seeded with the same pool.
type tickSchema struct {
	name string
	// indexes turns the migrated schema into this index set.
	indexes []string
	pg      *testenv.PG
}

// tickVariant is a batch statement (Config.scan) on one of the schemas.
type tickVariant struct {
	name   string
	scan   string
	schema *tickSchema
}

// The index sets compared: before migration 00010, the msisdn walk over a
// covering index (the suggestion), and migration 00010's; on each,
// the walks measured. after_chosen is what a sweep does (chooseWalk).
func tickVariants() []*tickVariant {
	before := &tickSchema{name: "before", indexes: []string{
		"drop index msisdn_pool_reserved_expiry",
		"create index msisdn_pool_stale_reservations on msisdn_pool (reserved_until) where state = 'RESERVED'",
	}}
	covering := &tickSchema{name: "covering", indexes: []string{
		"drop index msisdn_pool_reserved_expiry",
		"drop index msisdn_pool_reserved",
		"create index msisdn_pool_reserved_covering on msisdn_pool (msisdn) include (reserved_until) where state = 'RESERVED'",
		"create index msisdn_pool_stale_reservations on msisdn_pool (reserved_until) where state = 'RESERVED'",
	}}
	after := &tickSchema{name: "after"}
	return []*tickVariant{
		{name: "before_msisdn_walk", scan: "msisdn", schema: before},
		{name: "covering_msisdn_walk", scan: "msisdn", schema: covering},
		{name: "after_expiry_walk", scan: "expiry", schema: after},
		{name: "after_msisdn_walk", scan: "msisdn", schema: after},
		{name: "after_chosen", scan: "", schema: after},
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
// COORDINATOR_BENCH_REAPER_STALE change both), for each variant of
// tickVariants (COORDINATOR_BENCH_REAPER_VARIANTS: a comma-separated subset),
// and one UPDATE freeing the same rows on the schema of migration 00010.
// Each iteration is a round that runs every variant in a rotating order,
// each on its schema with the freed rows made stale again and vacuumed
// (untimed). Per variant it reports the median over rounds of:
//
//   - tick_ms: the sweep (the owned template with a memory locker, default
//     Config: batches of 1000, 2 workers) that frees the stale rows;
//   - idle_dirty_ms: a tick straight after it, with nothing stale, before
//     any vacuum (the freed rows' pages are not all-visible);
//   - idle_ms: the same after VACUUM.
//
// COORDINATOR_BENCH_REAPER_EXPLAIN=1 logs EXPLAIN (ANALYZE, BUFFERS) of the
// first batch statement of a sweep, and of an idle tick's before and after
// VACUUM, per variant that forces a walk, in the first round (-v shows it).
//
//	go test ./internal/msisdnreaper -run '^$' -bench ReaperTick -benchtime 3x -timeout 30m
func BenchmarkReaperTick(b *testing.B) {
	ctx := context.Background()
	reserved := benchCount(b, "COORDINATOR_BENCH_REAPER_RESERVED", 1_000_000)
	stale := benchCount(b, "COORDINATOR_BENCH_REAPER_STALE", reserved/100)
	explain := os.Getenv("COORDINATOR_BENCH_REAPER_EXPLAIN") == "1"
	variants := tickVariants()
	if only := os.Getenv("COORDINATOR_BENCH_REAPER_VARIANTS"); only != "" {
		variants = slices.DeleteFunc(variants, func(v *tickVariant) bool {
			return !slices.Contains(strings.Split(only, ","), v.name)
		})
	}
	var after *tickSchema
	for _, v := range variants {
		if v.schema.name == "after" {
			after = v.schema
		}
	}
	if after == nil {
		after = &tickSchema{name: "after"}
	}
	var schemas []*tickSchema
	for _, v := range variants {
		if !slices.Contains(schemas, v.schema) {
			schemas = append(schemas, v.schema)
		}
	}
	if !slices.Contains(schemas, after) {
		schemas = append(schemas, after)
	}
	for _, sc := range schemas {
		sc.pg = testenv.Postgres(b)
		for _, stmt := range sc.indexes {
			_, err := sc.pg.Pool.Exec(ctx, stmt)
			require.NoError(b, err, stmt)
		}
		_, err := Seed(ctx, sc.pg.Pool, SeedSpec{StaleReserved: stale, ValidReserved: reserved - stale})
		require.NoError(b, err)
		_, err = sc.pg.Pool.Exec(ctx, "vacuum (analyze) msisdn_pool")
		require.NoError(b, err)
	}
	walks := map[string]map[string]int{}
	tick := func(v *tickVariant, want int64) time.Duration {
		rec := &events.Recorder{}
		s := NewTestSweeper(v.schema.pg.Pool, memLocker(b, "bench", time.Second), rec, Config{Lease: 10 * time.Minute, scan: v.scan})
		t0 := time.Now()
		res := s.Sweep(ctx, job.Trigger{Source: job.SourceCLI, RequestID: "bench"})
		took := time.Since(t0)
		require.Equal(b, job.OutcomeCompleted, res.Outcome, res.Error)
		require.Equal(b, want, res.Counts["freed"], v.name)
		if walks[v.name] == nil {
			walks[v.name] = map[string]int{}
		}
		walks[v.name][fmt.Sprint(rec.OfType(events.RunCompleted)[0].Extra["walk"])]++
		return took
	}
	prepare := func(pg *testenv.PG) {
		b.StopTimer()
		defer b.StartTimer()
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
	for b.Loop() {
		for i := range len(variants) + 1 {
			k := (i + round) % (len(variants) + 1)
			if k == len(variants) {
				prepare(after.pg)
				t0 := time.Now()
				tag, err := after.pg.Pool.Exec(ctx, sqlSingleUpdate)
				single = append(single, ms(time.Since(t0)))
				require.NoError(b, err)
				require.Equal(b, int64(stale), tag.RowsAffected())
				continue
			}
			v := variants[k]
			if res[v.name] == nil {
				res[v.name] = map[string][]float64{}
			}
			r := res[v.name]
			prepare(v.schema.pg)
			show := explain && round == 0 && v.scan != ""
			if show {
				logExplain(b, v, "first batch of a sweep (vacuumed)")
			}
			r["tick_ms"] = append(r["tick_ms"], ms(tick(v, int64(stale))))
			if show {
				logExplain(b, v, "idle tick before vacuum")
			}
			r["idle_dirty_ms"] = append(r["idle_dirty_ms"], ms(tick(v, 0)))
			b.StopTimer()
			_, err := v.schema.pg.Pool.Exec(ctx, "vacuum msisdn_pool")
			require.NoError(b, err)
			b.StartTimer()
			if show {
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
		if v.scan == "" {
			b.Logf("%s walks: %v", v.name, walks[v.name])
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
	conn, err := v.schema.pg.Pool.Acquire(ctx)
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
