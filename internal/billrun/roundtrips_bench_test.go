package billrun

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/testenv"
)

// The batch as it was before issue 18, five round trips: BEGIN, the fence
// check, the invoices, the batch record, COMMIT. Kept only to measure the
// one-statement batch (sqlBatch) against it in one run.
const (
	before18FenceCheck = `
select r.fence, set_config('idle_in_transaction_session_timeout', $3, true)
from bill_runs r
where r.period = $1 and r.fence = $2 and r.status = 'RUNNING'
for share`
	before18Insert = `
with pop as materialized (
    select s.id, s.monthly_fee_cents,
           case when s.activated_at is null or s.activated_at <= $6 then 1
                else extract(day from s.activated_at at time zone $9)::int end as first_day,
           case when s.deactivated_at is null or s.deactivated_at >= $7 then $10::int
                else extract(day from (s.deactivated_at - interval '1 microsecond') at time zone $9)::int end as last_day,
           coalesce((select sum(u.amount_cents) from usage_charges u
                     where u.subscriber_id = s.id and u.period = $1), 0) as usage
    from subscribers s
    where s.id between $3 and $4
      and s.created_at <= $8
      and (s.activated_at is null or s.activated_at < $7)
      and (s.deactivated_at is null or s.deactivated_at > $6)
      and (s.status = 'ACTIVE' or s.deactivated_at is not null)
),
src as materialized (
    select id, usage,
           round(monthly_fee_cents::numeric * greatest(last_day - first_day + 1, 0) / $10::int)::bigint + usage as amount
    from pop
),
ins as (
    insert into invoices (subscriber_id, period, amount_cents, usage_cents, bill_run_fence)
    select id, $1, amount, usage, $2 from src order by id
    on conflict (subscriber_id, period) do nothing
    returning subscriber_id
),
n as materialized (select (select count(*) from src) as subscribers, (select count(*) from ins) as created)
select n.subscribers, n.created,
       case when n.subscribers > n.created then
           (select array_agg(id order by id)
            from (select id from (select id from src except select subscriber_id from ins) c
                  order by id limit $5) c)
       end
from n`
	before18Record = `
insert into bill_run_batches (period, first_id, last_id, fence, owner, subscribers, invoices_created, already_invoiced)
values ($1, $2, $3, $4, $5, $6, $7, $8)`
)

// BenchmarkBatchRoundTrips bills the same id ranges (1000 ids each) of a
// seeded period with 4 workers, five round trips per batch (before issue 18)
// and one (sqlBatch), in turn in every iteration, so both see the same
// machine. COORDINATOR_BENCH_BILLRUN_SUBSCRIBERS sets the population
// (default 200000).
func BenchmarkBatchRoundTrips(b *testing.B) {
	n := int64(200000)
	if v := os.Getenv("COORDINATOR_BENCH_BILLRUN_SUBSCRIBERS"); v != "" {
		var err error
		n, err = strconv.ParseInt(v, 10, 64)
		require.NoError(b, err)
	}
	const batch, workers = 1000, 4
	pg := testenv.Postgres(b)
	ctx := context.Background()
	p := Period{Year: 2026, Month: 10}
	seeded, err := Seed(ctx, pg.Pool, SeedConfig{Subscribers: n, SuspendedRatio: 0.05, TerminatedRatio: 0.05, Usage: true, Period: p})
	require.NoError(b, err)
	for _, q := range []string{`vacuum analyze subscribers`, `vacuum analyze usage_charges`} {
		_, err = pg.Pool.Exec(ctx, q)
		require.NoError(b, err)
	}
	start, end := p.Start(time.UTC), p.End(time.UTC)
	var cutoff time.Time
	require.NoError(b, pg.Pool.QueryRow(ctx, `select clock_timestamp()`).Scan(&cutoff))

	reset := func() {
		_, err := pg.Pool.Exec(ctx, `truncate invoices, bill_run_batches, bill_run_adjustments, bill_run_totals, bill_runs`)
		require.NoError(b, err)
		_, err = pg.Pool.Exec(ctx, `insert into bill_runs (period, status, owner, fence, attempts, started_at, updated_at)
			values ($1, 'RUNNING', 'bench', 1, 1, now(), now())`, p.String())
		require.NoError(b, err)
		_, err = pg.Pool.Exec(ctx, `checkpoint`)
		require.NoError(b, err)
	}
	run := func(one func(pool *pgxpool.Pool, first, last int64) (int64, error)) time.Duration {
		reset()
		ranges := make(chan int64)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var billed int64
		t := time.Now()
		for range workers {
			wg.Go(func() {
				for first := range ranges {
					got, err := one(pg.Pool, first, first+batch-1)
					if err != nil {
						b.Error(err)
						continue
					}
					mu.Lock()
					billed += got
					mu.Unlock()
				}
			})
		}
		for first := int64(1); first <= n; first += batch {
			ranges <- first
		}
		close(ranges)
		wg.Wait()
		d := time.Since(t)
		require.Equal(b, seeded.Active, billed)
		return d
	}
	five := func(pool *pgxpool.Pool, first, last int64) (int64, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		var fence int64
		var idle string
		if err := tx.QueryRow(ctx, before18FenceCheck, p.String(), int64(1), "10s").Scan(&fence, &idle); err != nil {
			return 0, err
		}
		var subs, created int64
		var sample []int64
		if err := tx.QueryRow(ctx, before18Insert, p.String(), int64(1), first, last, 20, start, end, cutoff, "UTC", p.Days()).
			Scan(&subs, &created, &sample); err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, before18Record, p.String(), first, last, int64(1), "bench", subs, created, subs-created); err != nil {
			return 0, err
		}
		return created, tx.Commit(ctx)
	}
	one := func(pool *pgxpool.Pool, first, last int64) (int64, error) {
		var fenced bool
		var subs, created int64
		var sample []int64
		err := pool.QueryRow(ctx, sqlBatch, p.String(), int64(1), first, last, 20, start, end, cutoff, "UTC", p.Days(), "bench").
			Scan(&fenced, &subs, &created, &sample)
		if err == nil && !fenced {
			b.Fatal("the bench claim's fence was not found")
		}
		return created, err
	}
	var tFive, tOne time.Duration
	for b.Loop() {
		tFive += run(five)
		tOne += run(one)
	}
	rows := float64(seeded.Active) * float64(b.N)
	b.ReportMetric(rows/tFive.Seconds(), "five_round_trips_rows/s")
	b.ReportMetric(rows/tOne.Seconds(), "one_statement_rows/s")
	b.ReportMetric(tFive.Seconds()/tOne.Seconds(), "one/five")
}
