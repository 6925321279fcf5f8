package billrun

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/telco-platform/coordinator/internal/owned"
)

// What is late in a COMPLETED period, found without reading its invoices
// (issue 28; migrations/00021_bill_run_late.sql).
//
// A subscriber s is late in period P when its invoice of P (with
// usage_cents) does not cover its usage charges of P less its adjustments
// (late usage), or when s is of P's population (no cutoff) and has no
// invoice of P (unbilled). Both depend only on s's rows: its usage charges
// of P, its invoice of P, its adjustments of P and its subscribers row.
//
// bill_run_late keeps, per period, a snapshot S and the set L of the
// subscribers late at S. Every write to one of those rows shows, by index,
// as a transaction id that S does not see: subscribers.changed_xid and
// usage_charges.changed_xid (the writer's id, by default and trigger), and
// bill_run_changes (deleted or moved usage, invoices written by anything
// but the bill run's batches, adjustments). So whoever is late now is in L
// or changed since S (T(S)), and the check evaluates only L ∪ T(S), each
// subscriber by its indexes: one statement, O(|L| + |T|), whatever the
// period's size. Writing back (S', L') from the same statement's snapshot
// keeps T small (refreshLate).
//
// Where L comes from:
//   - a completion (complete.go): the run's first claim recorded a base
//     snapshot S0 when the period had no invoice and no adjustment yet
//     (sqlLateBase); every invoice of the period is then written after S0,
//     a batch's with the usage it saw, so a subscriber late at completion
//     has changed since S0, or has no invoice (the reconcile lists those:
//     unbilled). A completion after a COMPLETED row was set back by hand
//     starts from the row it kept.
//   - else the full check (sqlLateFull: every invoice of the period, as
//     before issue 28), which a trigger that finds no usable row meets
//     under the lock, once.
//
// The bill run's own batches are not logged: they write only while the row
// is not COMPLETED, under a claim fence, and a kept row is used only for
// the fence it was computed under (bill_fence): a new claim (a row set back
// by hand) makes it the next completion's base, never an answer.

// maxLateIDs bounds L: a period with more late subscribers than this keeps
// no row, and its triggers take the lock and the full check, as before
// issue 28 (evaluating that many subscribers one by one would be no faster).
// It bounds T(S) the same way: more changed since the kept snapshot (a bulk
// update of subscribers) sends the trigger to the full check, once.
const maxLateIDs = 10000

// systemID is the cluster's id: a snapshot of another cluster (a restore
// from a dump) means nothing here.
const systemID = `(select system_identifier from pg_control_system())`

// lateEval evaluates the subscribers of cand(id) for period $1, as a CTE
// named eval (id, late, unbilled): late is the usage no invoice or
// adjustment covers (the full check's amount; 0 without an invoice),
// unbilled whether s is of the population between start and end (no
// cutoff) with no invoice (the full check's predicate); without start and
// end, false. Each subscriber is a few index probes.
func lateEval(start, end string) string {
	unbilled := "false"
	if start != "" {
		unbilled = `i.subscriber_id is null
             and exists (select from subscribers s where s.id = c.id
                         and ` + population(start, end, "'infinity'::timestamptz") + `)`
	}
	return `eval as (
    select c.id,
           case when i.usage_cents is not null then
                (select coalesce(sum(u.amount_cents), 0) from usage_charges u where u.subscriber_id = c.id and u.period = $1)
                - i.usage_cents
                - coalesce((select sum(x.amount_cents) from invoice_adjustments x where x.subscriber_id = c.id and x.period = $1), 0)
           else 0 end as late,
           ` + unbilled + ` as unbilled
    from cand c
    left join invoices i on i.subscriber_id = c.id and i.period = $1
)`
}

// lateChanged lists, as a CTE named changed with one row (ids), the
// subscribers whose rows of period $1 changed in a transaction that the
// snapshot k.snap does not see (k: a CTE of one row or none).
// withSubscribers adds changed subscribers rows (the unbilled side).
//
// An array, not rows: the planner then takes the candidates for the few
// they are (an unnested array counts 10), and probes each subscriber by
// index, instead of planning for a third of the table (its guess for
// changed_xid >= x) and paying a hash join over the period's invoices,
// and a JIT compilation, for nothing.
func lateChanged(k string, withSubscribers bool) string {
	notSeen := func(col string) string {
		return col + ` >= pg_snapshot_xmin(` + k + `.snap) and not pg_visible_in_snapshot(` + col + `, ` + k + `.snap)`
	}
	q := `changed as materialized (
    select array(
        select u.subscriber_id from ` + k + `, usage_charges u
        where u.period = $1 and ` + notSeen("u.changed_xid") + `
        union
        select x.subscriber_id from ` + k + `, bill_run_changes x
        where x.period = $1 and ` + notSeen("x.changed_xid")
	if withSubscribers {
		q += `
        union
        select s.id from ` + k + `, subscribers s
        where ` + notSeen("s.changed_xid")
	}
	return q + `) as ids
)`
}

// sqlLateCached reads period $1's bill_runs row (its totals, whether an
// adjustment run is RUNNING) and, when its kept row belongs to the row's
// fence and this cluster, checks L ∪ T(S): the late usage, its amount, the
// unbilled subscribers, who they are, how many changed since S, and the
// statement's own snapshot (what refreshLate writes back).
//
// More than $4 changed (a bulk update of subscribers) evaluates nobody:
// the caller checks in full, under the lock, once, and keeps a fresh
// snapshot, rather than every duplicate evaluating them one by one.
//
// $1 period, $2 and $3 the period's instants when the row recorded none,
// $4 the most changed subscribers evaluated.
var sqlLateCached = `
with r as materialized (
    select r.status, coalesce(r.owner, '') as owner, r.fence, r.batches_done, r.subscribers, r.invoices_created,
           r.already_invoiced, r.repaired, r.population,
           coalesce(r.period_start, $2) as ps, coalesce(r.period_end, $3) as pe,
           exists (select from bill_run_adjustments a where a.period = $1 and a.status = 'RUNNING') as adjusting
    from bill_runs r
    where r.period = $1
),
k as materialized (
    select l.snap, l.ids, l.version
    from bill_run_late l, r
    where l.period = $1 and l.bill_fence = r.fence and r.status = 'COMPLETED' and l.system_id = ` + systemID + `
),
` + lateChanged("k", true) + `,
cand as (select distinct unnest(k.ids || changed.ids) as id from k, changed where cardinality(changed.ids) <= $4),
` + lateEval("(select ps from r)", "(select pe from r)") + `,
found as materialized (select id, late, unbilled from eval where late <> 0 or unbilled)
select r.status, r.owner, r.fence, r.batches_done, r.subscribers, r.invoices_created, r.already_invoiced,
       r.repaired, r.population, r.adjusting,
       k.version, (select cardinality(ids) from changed),
       (select count(*) from found where not unbilled),
       (select coalesce(sum(late), 0)::bigint from found where not unbilled),
       (select count(*) from found where unbilled),
       (select coalesce(array_agg(id order by id), '{}') from found),
       pg_current_snapshot()::text
from r left join k on true`

// sqlLateRefresh writes back a check's snapshot and late subscribers, for
// the fence and version it started from; a row another check is writing is
// skipped, not waited for.
//
// $1 period, $2 bill fence, $3 version read, $4 snapshot, $5 ids.
const sqlLateRefresh = `
update bill_run_late
set snap = $4::pg_snapshot, ids = $5, version = nextval('bill_run_late_version'), checked_at = clock_timestamp()
where period = $1 and bill_fence = $2 and version = $3
  and period in (select period from bill_run_late where period = $1 for update skip locked)`

// sqlLateFull is the full check, as before issue 28 (sqlLateUsage and
// sqlUnbilled): every invoice of the period, and the population (no
// cutoff) anti-joined with them. In the same statement, so under the same
// snapshot, it keeps what it found for the row's fence (when COMPLETED and
// at most $4 subscribers).
//
// $1 period, $2 period start, $3 period end, $4 most ids kept.
var sqlLateFull = `
with late as materialized (
    select i.subscriber_id as id, u.total - i.usage_cents - coalesce(a.adjusted, 0) as amount
    from invoices i
    cross join lateral (select coalesce(sum(c.amount_cents), 0) as total from usage_charges c
                        where c.subscriber_id = i.subscriber_id and c.period = i.period) u
    cross join lateral (select sum(x.amount_cents) as adjusted from invoice_adjustments x
                        where x.subscriber_id = i.subscriber_id and x.period = i.period) a
    where i.period = $1 and i.usage_cents is not null
),
unbilled as materialized (
    select s.id from subscribers s
    where ` + population("$2", "$3", "'infinity'::timestamptz") + `
      and not exists (select from invoices i where i.subscriber_id = s.id and i.period = $1)
),
found as materialized (
    select id from late where amount <> 0
    union all
    select id from unbilled
),
kept as (
    insert into bill_run_late as l (period, bill_fence, snap, ids, system_id)
    select $1, r.fence, pg_current_snapshot(), (select coalesce(array_agg(id order by id), '{}') from found), ` + systemID + `
    from bill_runs r
    where r.period = $1 and r.status = 'COMPLETED' and (select count(*) from found) <= $4
    on conflict (period) do update
    set bill_fence = excluded.bill_fence, snap = excluded.snap, ids = excluded.ids, system_id = excluded.system_id,
        version = nextval('bill_run_late_version'), checked_at = clock_timestamp()
)
select (select count(*) from late where amount <> 0),
       (select coalesce(sum(amount), 0)::bigint from late where amount <> 0),
       (select count(*) from unbilled)`

// sqlLateBase records, at a bill run's claim, the snapshot its completion
// starts from: only when the period has no invoice and no adjustment yet
// (then every invoice of it is written after this snapshot), and never over
// a row kept already (a row set back by hand keeps its last check).
//
// $1 period.
var sqlLateBase = `
insert into bill_run_late (period, bill_fence, snap, system_id)
select $1, null, pg_current_snapshot(), ` + systemID + `
where not exists (select from invoices i where i.period = $1)
  and not exists (select from invoice_adjustments x where x.period = $1)
on conflict (period) do nothing`

// sqlLateAtCompletion evaluates, inside the completion transaction, the
// late usage of the subscribers kept late at the base or changed since
// it (the unbilled side comes from the reconcile). No row back: no base in
// this cluster.
//
// $1 period.
var sqlLateAtCompletion = `
with k as materialized (
    select l.snap, l.ids from bill_run_late l where l.period = $1 and l.system_id = ` + systemID + `
),
` + lateChanged("k", false) + `,
cand as (select distinct unnest(k.ids || changed.ids) as id from k, changed),
` + lateEval("", "") + `
select (select coalesce(array_agg(id), '{}') from eval where late <> 0)
from k`

// sqlLateKeep stores a completion's check: its snapshot, taken before the
// reconcile, and the subscribers late or unbilled then.
//
// $1 period, $2 bill fence, $3 snapshot, $4 ids.
var sqlLateKeep = `
insert into bill_run_late as l (period, bill_fence, snap, ids, system_id)
values ($1, $2, $3::pg_snapshot, $4, ` + systemID + `)
on conflict (period) do update
set bill_fence = excluded.bill_fence, snap = excluded.snap, ids = excluded.ids, system_id = excluded.system_id,
    version = nextval('bill_run_late_version'), checked_at = clock_timestamp()`

// lateState is one read of a period (sqlLateCached).
type lateState struct {
	status, owner string
	fence         int64
	counts        map[string]int64 // the period's totals, as run.already_completed carries them
	adjusting     bool             // an adjustment run is RUNNING
	cached        bool             // a kept row answered: check is set
	version       int64
	changed       int64
	check         lateCheck
	ids           []int64
	snap          string
}

// readLate reads p's row and checks it from its kept row, if usable.
// ErrNotFound when p has no bill run.
func (w *Worker) readLate(ctx context.Context, p Period) (lateState, error) {
	var (
		s                          lateState
		batches                    int32
		subs, created, already     int64
		repaired                   int64
		population, version        *int64
		lateSubs, lateCents, unbil int64
	)
	zone := w.cfg.Calendar.Zone
	err := w.pool.QueryRow(ctx, sqlLateCached, p.String(), p.Start(zone), p.End(zone), maxLateIDs).Scan(
		&s.status, &s.owner, &s.fence, &batches, &subs, &created, &already, &repaired, &population, &s.adjusting,
		&version, &s.changed, &lateSubs, &lateCents, &unbil, &s.ids, &s.snap)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, ErrNotFound
	}
	if err != nil {
		return s, fmt.Errorf("billrun: read %s's late check: %w", p, err)
	}
	// The totals bill_runs keeps once COMPLETED (sqlFinish: the sums of the
	// period's batches, with what the completion repaired), as the
	// claim's already_completed answer reads them (ReadStatus).
	s.counts = map[string]int64{
		CountPeriodBatches: int64(batches), CountPeriodSubscribers: subs, CountPeriodInvoicesCreated: created,
		CountPeriodAlreadyInvoiced: already, CountRepaired: repaired,
	}
	if population != nil {
		s.counts[CountPopulation] = *population
	}
	if version != nil && s.changed <= maxLateIDs {
		s.cached, s.version = true, *version
		s.check = lateCheck{subscribers: lateSubs, cents: lateCents, unbilled: unbil}
	}
	return s, nil
}

// refreshLate writes back a check that met changes, so the next one starts
// from its snapshot. Best effort: a failure only leaves the next check more
// to evaluate.
func (w *Worker) refreshLate(ctx context.Context, run *owned.Run, p Period, s lateState) {
	if !s.cached || s.changed == 0 || len(s.ids) > maxLateIDs {
		return
	}
	if _, err := w.pool.Exec(ctx, sqlLateRefresh, p.String(), s.fence, s.version, s.snap, s.ids); err != nil {
		run.Log().Warn("billrun_late_check_not_kept", "period", p.String(), "error", err)
	}
}

// fullLate is the full check (sqlLateFull); it keeps what it found.
func (w *Worker) fullLate(ctx context.Context, p Period) (lateCheck, error) {
	start, end, _, err := w.instants(ctx, w.pool, p)
	if err != nil {
		return lateCheck{}, err
	}
	var c lateCheck
	err = w.pool.QueryRow(ctx, sqlLateFull, p.String(), start, end, maxLateIDs).Scan(&c.subscribers, &c.cents, &c.unbilled)
	return c, err
}

// lateUsage checks p's late usage and unbilled subscribers: from the kept
// row when it belongs to the row's fence, else in full. It says which.
func (w *Worker) lateUsage(ctx context.Context, run *owned.Run, p Period) (lateCheck, string, error) {
	s, err := w.readLate(ctx, p)
	if err != nil {
		return lateCheck{}, "", err
	}
	if s.cached {
		w.refreshLate(ctx, run, p, s)
		return s.check, lateHowKept, nil
	}
	c, err := w.fullLate(ctx, p)
	return c, lateHowFull, err
}

// How a late check was answered (coordinator_billrun_late_checks_total{how}).
const (
	lateHowKept = "kept" // from bill_run_late: the subscribers late at its snapshot and those changed since
	lateHowFull = "full" // every invoice of the period
)

// keepAtCompletion stores, inside the completion transaction, what is late
// in the period as it is COMPLETED (see the top of this file): snap was
// taken before the reconcile, unbilled is the reconcile's list. Nothing is
// kept without a base in this cluster, or past maxLateIDs: the first
// trigger then checks in full.
//
// It runs in a savepoint: an error leaves the completion's transaction as
// it was (the caller goes on without a kept row, or retries a transient
// error whole).
func keepAtCompletion(ctx context.Context, outer pgx.Tx, p Period, fence int64, snap string, unbilled []int64) error {
	if len(unbilled) > maxLateIDs {
		return nil
	}
	tx, err := outer.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // no-op after Commit
	var late []int64
	err = tx.QueryRow(ctx, sqlLateAtCompletion, p.String()).Scan(&late)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // no base
	}
	if err != nil {
		return err
	}
	ids := append(slices.Clone(unbilled), late...)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if len(ids) > maxLateIDs {
		return nil
	}
	if _, err = tx.Exec(ctx, sqlLateKeep, p.String(), fence, snap, ids); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
