package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The verifier's own tables live in schema chaos, beside the product's
// (migrated by `coordinator migrate up`), in the verifier's private cluster.
const sqlChaosSchema = `
create schema if not exists chaos;
create table if not exists chaos.sections (
    id         bigserial primary key,
    key        text   not null,
    fence      bigint not null,
    owner      text,
    lock_pid   int    not null,
    lock_start bigint not null,
    pid        int    not null,
    start_ns   bigint not null,
    end_ns     bigint
);
create table if not exists chaos.writes (
    id         bigserial primary key,
    key        text   not null,
    fence      bigint not null,
    lock_pid   int    not null,
    lock_start bigint not null,
    pid        int    not null,
    role       text   not null,
    mono_ns    bigint not null
);
create table if not exists chaos.procs (
    pid        int    not null,
    start_time bigint not null,
    lock_pid   int    not null,
    lock_start bigint not null,
    role       text   not null,
    key        text   not null,
    fence      bigint not null,
    started_ns bigint not null,
    ended_ns   bigint,
    primary key (pid, start_time)
);
create index if not exists procs_lock on chaos.procs (lock_pid, lock_start);

-- Every change of the product's bill_runs rows, written in the changing
-- transaction: its commit time (track_commit_timestamp) is when a claim
-- took effect. The product's schema is not altered, only observed.
create table if not exists chaos.bill_run_log (
    id         bigserial primary key,
    period     text   not null,
    status     text   not null,
    owner      text,
    fence      bigint not null,
    lock_fence bigint,
    op         text   not null,
    event_id   text
);
create or replace function chaos.log_bill_run() returns trigger language plpgsql as $$
begin
    insert into chaos.bill_run_log (period, status, owner, fence, lock_fence, op, event_id)
    values (new.period, new.status, new.owner, new.fence, new.lock_fence, tg_op, new.completion_event_id);
    return new;
end $$;
drop trigger if exists chaos_bill_run_log on bill_runs;
create trigger chaos_bill_run_log after insert or update on bill_runs
    for each row execute function chaos.log_bill_run();

-- The fenced store of the in-process lock workers: a write is accepted only
-- if its fence is at least the highest the key has accepted. The row lock
-- on fence_state serialises a key's writes, so ids are their commit order.
create table if not exists chaos.fence_state (
    key   text primary key,
    fence bigint not null
);
create table if not exists chaos.fenced_writes (
    id       bigserial primary key,
    key      text    not null,
    fence    bigint  not null,
    holder   text    not null,
    accepted boolean not null,
    mono_ns  bigint  not null
);
create or replace function chaos.fenced_write(k text, f bigint, who text, ns bigint) returns boolean
language plpgsql as $$
declare
    cur bigint;
begin
    insert into chaos.fence_state (key, fence) values (k, f) on conflict (key) do nothing;
    select fence into cur from chaos.fence_state where key = k for update;
    if f > cur then
        update chaos.fence_state set fence = f where key = k;
    end if;
    insert into chaos.fenced_writes (key, fence, holder, accepted, mono_ns) values (k, f, who, f >= cur, ns);
    return f >= cur;
end $$;
`

// seedSubscribers bills every subscriber the same way in every period:
// all ACTIVE, fee 1000 + id % 13 cents, and usage of 25 + id % 50 cents on
// every fifth subscriber in each of periods.
func seedSubscribers(ctx context.Context, pool *pgxpool.Pool, n int, periods []string) error {
	if _, err := pool.Exec(ctx, `
insert into subscribers (id, msisdn, status, monthly_fee_cents)
select g, '4479' || lpad(g::text, 8, '0'), 'ACTIVE', 1000 + g % 13
from generate_series(1, $1::bigint) g`, n); err != nil {
		return fmt.Errorf("seed subscribers: %w", err)
	}
	if _, err := pool.Exec(ctx, `
insert into usage_charges (subscriber_id, period, amount_cents)
select g, p, 25 + g % 50
from generate_series(5, $1::bigint, 5) g, unnest($2::text[]) p`, n, periods); err != nil {
		return fmt.Errorf("seed usage: %w", err)
	}
	if _, err := pool.Exec(ctx, `analyze subscribers; analyze usage_charges`); err != nil {
		return err
	}
	return nil
}

// seedReservations adds stale expired reservations (numbers 4477..., the
// reaper must free them) and live ones held for an hour (4476..., it must
// leave them alone). batch keeps the numbers of successive calls apart.
func seedReservations(ctx context.Context, pool *pgxpool.Pool, batch, stale, live int) error {
	_, err := pool.Exec(ctx, `
insert into msisdn_pool (msisdn, state, reserved_until, reserved_by)
select case when g <= $2 then '4477' else '4476' end || lpad(($1::int * 100000 + g)::text, 9, '0'), 'RESERVED',
       case when g <= $2 then now() - interval '1 second' else now() + interval '1 hour' end,
       'chaos'
from generate_series(1, $2::int + $3::int) g`, batch, stale, live)
	if err != nil {
		return fmt.Errorf("seed reservations: %w", err)
	}
	return nil
}

// loadPool counts what the reaper left: expired reservations older than two
// sweep intervals, and live ones still held.
func loadPool(ctx context.Context, pool *pgxpool.Pool, sweepEvery time.Duration) (PoolStat, error) {
	var s PoolStat
	// Live reservations are counted in the table, not as the verifier added
	// them: an insert PostgreSQL lost (postgres-lost-commits) was never there.
	err := pool.QueryRow(ctx, `
select count(*) filter (where state = 'RESERVED' and msisdn like '4477%' and reserved_until < now() - $1::interval),
       count(*) filter (where state = 'RESERVED' and msisdn like '4476%'),
       count(*) filter (where msisdn like '4476%')
from msisdn_pool`, (2*sweepEvery).String()).Scan(&s.StaleLeft, &s.LiveLeft, &s.LiveSeeded)
	return s, err
}

func loadSections(ctx context.Context, pool *pgxpool.Pool) ([]Section, error) {
	rows, err := pool.Query(ctx, `select id, key, fence, coalesce(owner, ''), lock_pid, lock_start, pid, start_ns, coalesce(end_ns, 0) from chaos.sections order by id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Section, error) {
		var s Section
		var ls int64
		err := r.Scan(&s.ID, &s.Key, &s.Fence, &s.Owner, &s.LockPID, &ls, &s.PID, &s.StartNS, &s.EndNS)
		s.LockStart = uint64(ls)
		return s, err
	})
}

func loadWrites(ctx context.Context, pool *pgxpool.Pool) ([]Write, error) {
	rows, err := pool.Query(ctx, `select id, key, fence, lock_pid, lock_start, pid, role, mono_ns from chaos.writes order by id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Write, error) {
		var w Write
		var ls int64
		err := r.Scan(&w.ID, &w.Key, &w.Fence, &w.LockPID, &ls, &w.PID, &w.Role, &w.MonoNS)
		w.LockStart = uint64(ls)
		return w, err
	})
}

func loadProcs(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, where string, args ...any) ([]HelperProc, error) {
	rows, err := q.Query(ctx, `select pid, start_time, lock_pid, lock_start, role, key, fence, started_ns, coalesce(ended_ns, 0) from chaos.procs `+where, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (HelperProc, error) {
		var p HelperProc
		var st, ls int64
		err := r.Scan(&p.PID, &st, &p.LockPID, &ls, &p.Role, &p.Key, &p.Fence, &p.StartedNS, &p.EndedNS)
		p.StartTime, p.LockStart = uint64(st), uint64(ls)
		return p, err
	})
}

func loadBillRuns(ctx context.Context, pool *pgxpool.Pool) ([]BillRunRow, error) {
	rows, err := pool.Query(ctx, `select period, status, coalesce(owner, ''), fence, coalesce(lock_fence, 0), attempts,
       coalesce(last_error, ''), coalesce((extract(epoch from finished_at) * 1e9)::bigint, 0),
       coalesce(completion_event_id, '')
from bill_runs order by period`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (BillRunRow, error) {
		var b BillRunRow
		err := r.Scan(&b.Period, &b.Status, &b.Owner, &b.Fence, &b.LockFence, &b.Attempts, &b.LastError, &b.FinishedNS, &b.EventID)
		return b, err
	})
}

// billRunStatuses is period -> status, for the recovery phase's polling.
func billRunStatuses(ctx context.Context, pool *pgxpool.Pool) (map[string]string, error) {
	rows, err := pool.Query(ctx, `select period, status from bill_runs`)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var p, s string
	_, err = pgx.ForEachRow(rows, []any{&p, &s}, func() error { out[p] = s; return nil })
	return out, err
}

// unackedCompletions counts the COMPLETED bill runs whose run.completed
// Kafka has not acknowledged yet (the resumers re-publish them).
func unackedCompletions(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `select count(*) from bill_runs where status = 'COMPLETED' and completed_event_at is null and completion_event_id is not null`).Scan(&n)
	return n, err
}

// runningOwners is owner replica id -> a period it runs (status RUNNING).
func runningOwners(ctx context.Context, pool *pgxpool.Pool) (map[string]string, error) {
	rows, err := pool.Query(ctx, `select owner, period from bill_runs where status = 'RUNNING' and owner is not null order by updated_at desc`)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var o, p string
	_, err = pgx.ForEachRow(rows, []any{&o, &p}, func() error {
		if _, ok := out[o]; !ok {
			out[o] = p
		}
		return nil
	})
	return out, err
}

func loadBillRunLog(ctx context.Context, pool *pgxpool.Pool) ([]BillRunChange, error) {
	rows, err := pool.Query(ctx, `select id, period, status, coalesce(owner, ''), fence, coalesce(lock_fence, 0), op,
       coalesce(pg_xact_commit_timestamp(xmin), 'epoch'::timestamptz), coalesce(event_id, '')
from chaos.bill_run_log order by id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (BillRunChange, error) {
		var c BillRunChange
		err := r.Scan(&c.ID, &c.Period, &c.Status, &c.Owner, &c.Fence, &c.LockFence, &c.Op, &c.CommittedAt, &c.EventID)
		return c, err
	})
}

func loadFencedWrites(ctx context.Context, pool *pgxpool.Pool) ([]FencedWrite, error) {
	rows, err := pool.Query(ctx, `select id, key, fence, holder, accepted, mono_ns,
       coalesce(pg_xact_commit_timestamp(xmin), 'epoch'::timestamptz)
from chaos.fenced_writes order by id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (FencedWrite, error) {
		var w FencedWrite
		err := r.Scan(&w.ID, &w.Key, &w.Fence, &w.Holder, &w.Accepted, &w.MonoNS, &w.CommittedAt)
		return w, err
	})
}

// runningRuns is period -> owner of every RUNNING bill run.
func runningRuns(ctx context.Context, pool *pgxpool.Pool) (map[string]string, error) {
	rows, err := pool.Query(ctx, `select period, coalesce(owner, '') from bill_runs where status = 'RUNNING'`)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	var p, o string
	_, err = pgx.ForEachRow(rows, []any{&p, &o}, func() error { out[p] = o; return nil })
	return out, err
}

func loadBatches(ctx context.Context, pool *pgxpool.Pool) ([]BatchRow, error) {
	// The commit time of the row's transaction (track_commit_timestamp),
	// falling back to committed_at (when the row was written).
	rows, err := pool.Query(ctx, `select period, first_id, last_id, fence, owner,
       coalesce(pg_xact_commit_timestamp(xmin), committed_at)
from bill_run_batches order by period, 6`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (BatchRow, error) {
		var b BatchRow
		err := r.Scan(&b.Period, &b.FirstID, &b.LastID, &b.Fence, &b.Owner, &b.CommittedAt)
		return b, err
	})
}

// sqlInvoiceStats compares every period's invoices with the subscribers it
// must bill ($1: the periods the verifier triggered): each billable
// (ACTIVE) subscriber exactly once, amount = monthly fee + the period's
// usage charges. seedSubscribers leaves activated_at and deactivated_at
// NULL (active since before any period, never deactivated), so every
// period's population is the ACTIVE subscribers and proration bills each
// the full fee (the bill run's proration rules, internal/billrun). Periods that hold invoices but were never triggered are
// included too.
const sqlInvoiceStats = `
with periods as (
    select unnest($1::text[]) as period
    union select distinct period from invoices
),
billable as (select id, monthly_fee_cents as fee from subscribers where status = 'ACTIVE'),
usage as (select subscriber_id, period, sum(amount_cents) as amount from usage_charges group by 1, 2),
inv as (select subscriber_id, period, count(*) as n, min(amount_cents) as lo, max(amount_cents) as hi
        from invoices group by 1, 2),
expected as (
    select p.period, b.id, b.fee + coalesce(u.amount, 0) as amount
    from periods p cross join billable b
    left join usage u on u.subscriber_id = b.id and u.period = p.period
),
cmp as (
    select coalesce(e.period, i.period) as period, coalesce(e.id, i.subscriber_id) as id,
           e.id is not null as billable, i.n, i.lo, i.hi, e.amount
    from expected e
    full join inv i on i.subscriber_id = e.id and i.period = e.period
)
select period,
       count(*) filter (where billable),
       coalesce(sum(n) filter (where n is not null), 0),
       count(*) filter (where billable and n is null),
       count(*) filter (where n > 1),
       count(*) filter (where billable and n is not null and (lo <> amount or hi <> amount)),
       count(*) filter (where not billable),
       (array_agg(id order by id) filter (where (billable and n is null) or n > 1 or not billable
                                           or (n is not null and (lo <> amount or hi <> amount))))[1:5]
from cmp
group by period
order by period`

func loadInvoiceStats(ctx context.Context, pool *pgxpool.Pool, periods []string) ([]InvoiceStat, error) {
	rows, err := pool.Query(ctx, sqlInvoiceStats, periods)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (InvoiceStat, error) {
		var s InvoiceStat
		err := r.Scan(&s.Period, &s.Expected, &s.Invoices, &s.Missing, &s.Duplicates, &s.WrongAmount, &s.Unexpected, &s.Sample)
		return s, err
	})
}
