package billrun

// SQL of the bill run, parameterised, one named constant per statement.

// sqlClaim takes the period's row for this replica: a new row gets fence 1,
// an existing one that is not COMPLETED gets fence+1, this owner and status
// RUNNING. A COMPLETED row is left alone and nothing is returned. The upsert
// takes the row lock, so it waits for every batch transaction that holds the
// row FOR SHARE under the previous fence; once it commits, those fence checks
// find no row.
//
// A lock fence below the one the row recorded is refused (nothing is
// returned): that holder's lock was lost and re-taken by a newer holder
// (Redis fences rise per key, also across restarts and failovers), so a
// stale holder cannot take the run from the newer one.
//
// The claim also records who asked (the trigger's requested_by, principal,
// request id and source; empty values are NULL), so the row names the
// requester of the run that holds or last held it.
//
// A claim clears completed_event_at and completion_event_id: the completion
// it will make is a new one, whose run.completed no sink has acknowledged (a row is claimable
// only when not COMPLETED, so this matters only for a row set back by
// hand).
//
// The first claim fixes the run's population cutoff: the period's first and
// end instants in the billing zone, the zone's name and the claim time.
// Later claims keep them (a resume bills the same population, whatever the
// zone configured then and whoever was added since); the cutoff comes back.
//
// $1 period, $2 owner, $3 lock fence, $4 requested_by, $5 principal,
// $6 request_id, $7 trigger source, $8 period start, $9 period end,
// $10 billing zone.
const sqlClaim = `
insert into bill_runs as r (period, status, owner, fence, lock_fence, attempts, started_at, updated_at,
                            requested_by, principal, request_id, trigger_source,
                            period_start, period_end, billing_tz, cutoff_at)
values ($1, 'RUNNING', $2, 1, $3, 1, clock_timestamp(), clock_timestamp(),
        nullif($4, ''), nullif($5, ''), nullif($6, ''), nullif($7, ''),
        $8, $9, $10, clock_timestamp())
on conflict (period) do update
set status         = 'RUNNING',
    owner          = excluded.owner,
    fence          = r.fence + 1,
    lock_fence     = excluded.lock_fence,
    attempts       = r.attempts + 1,
    started_at     = clock_timestamp(),
    finished_at    = null,
    completed_event_at = null,
    completion_event_id = null,
    last_error     = null,
    updated_at     = clock_timestamp(),
    requested_by   = excluded.requested_by,
    principal      = excluded.principal,
    request_id     = excluded.request_id,
    trigger_source = excluded.trigger_source,
    period_start   = coalesce(r.period_start, excluded.period_start),
    period_end     = coalesce(r.period_end, excluded.period_end),
    billing_tz     = coalesce(r.billing_tz, excluded.billing_tz),
    cutoff_at      = coalesce(r.cutoff_at, excluded.cutoff_at)
where r.status <> 'COMPLETED'
  and (r.lock_fence is null or r.lock_fence <= excluded.lock_fence)
returning r.fence`

// sqlCutoff reads the population cutoff the claim recorded, while the claim
// is ours.
//
// $1 period, $2 claim fence.
const sqlCutoff = `
select period_start, period_end, billing_tz, cutoff_at
from bill_runs
where period = $1 and fence = $2 and status = 'RUNNING'`

// sqlIncomplete lists the periods whose run is not COMPLETED, with when
// the latest claim started and its trigger (the resumer's view).
const sqlIncomplete = `
select period, status, coalesce(started_at, updated_at), coalesce(request_id, ''), coalesce(requested_by, ''),
       coalesce(trigger_source, '')
from bill_runs
where status <> 'COMPLETED'
order by period`

// sqlStatus reads a period's row with totals summed from its committed
// batches (and what its completion repaired and counted), and for its
// progress: the batches and subscribers of the latest
// claim (fence) and the seconds it has run, by the database's clock, and
// its total (bill_run_totals; bill_runs.batches_total once finished); then
// the population cutoff and the period's adjustment runs, if any.
const sqlStatus = `
select r.period, r.status, coalesce(r.owner, ''), r.fence, r.lock_fence, r.attempts,
       r.started_at, r.finished_at, r.updated_at, coalesce(r.last_error, ''),
       coalesce(r.requested_by, ''), coalesce(r.principal, ''), coalesce(r.request_id, ''), coalesce(r.trigger_source, ''),
       t.batches, t.subscribers, t.created, t.already,
       coalesce(tot.batches_total, r.batches_total), t.fence_batches, t.fence_subscribers,
       coalesce(extract(epoch from coalesce(r.finished_at, clock_timestamp()) - r.started_at), 0)::float8,
       r.period_start, r.period_end, r.billing_tz, r.cutoff_at,
       a.status, a.fence, a.adjustments, a.amount_cents, a.finished_at, a.invoices_created,
       r.repaired, r.population
from bill_runs r
     left join bill_run_adjustments a on a.period = r.period
     left join bill_run_totals tot on tot.period = r.period and tot.fence = r.fence,
     lateral (select count(*)                           as batches,
                     coalesce(sum(b.subscribers), 0)      as subscribers,
                     coalesce(sum(b.invoices_created), 0) as created,
                     coalesce(sum(b.already_invoiced), 0) as already,
                     count(*) filter (where b.fence = r.fence)                        as fence_batches,
                     coalesce(sum(b.subscribers) filter (where b.fence = r.fence), 0) as fence_subscribers
              from bill_run_batches b
              where b.period = r.period) t
where r.period = $1`

// population is the period's population, one predicate on subscribers s
// for every statement that walks, counts, bills or reconciles it (start,
// end and cutoff name the statement's parameters): subscribers created by
// the cutoff, activated before the period's end (or NULL: since before any
// period), not deactivated by its start (deactivated_at NULL or later than
// the start), and not deactivated by status alone (a status other than
// ACTIVE with no deactivated_at counts as deactivated before any period).
// The keyset steps walk the primary key and filter on the row (a narrow
// one): about 0.6 ms per 1,000 ids.
func population(start, end, cutoff string) string {
	return `s.created_at <= ` + cutoff + `
  and (s.activated_at is null or s.activated_at < ` + end + `)
  and (s.deactivated_at is null or s.deactivated_at > ` + start + `)
  and (s.status = 'ACTIVE' or s.deactivated_at is not null)`
}

// sqlCountToPlan estimates what a run still has to plan: the period's
// population less those in the batches earlier claims committed (as they
// were counted when committed). Not this claim's own ($5): the run plans
// those, and a count that ran after its first commits undercounted the
// total by them (TestCountToPlanLeavesThisClaimsBatchesIn).
//
// $1 period, $2 period start, $3 period end, $4 cutoff, $5 claim fence.
var sqlCountToPlan = `
select (select count(*) from subscribers s
        where ` + population("$2", "$3", "$4") + `)
     - (select coalesce(sum(subscribers), 0) from bill_run_batches where period = $1 and fence <> $5)`

// sqlRecordTotal stores the run's batches total (the progress
// denominator) in bill_run_totals while the claim is ours. Not an UPDATE of
// bill_runs: that would wait for every batch holding the row FOR SHARE.
// A total of an older claim never replaces a newer one's.
//
// $1 period, $2 claim fence, $3 batches in all.
const sqlRecordTotal = `
insert into bill_run_totals as t (period, fence, batches_total)
select $1, $2, $3
where exists (select from bill_runs where period = $1 and fence = $2 and status = 'RUNNING')
on conflict (period) do update
set fence = excluded.fence, batches_total = excluded.batches_total
where t.fence <= excluded.fence`

// sqlCommittedRanges lists the batches already committed for a period (the
// resume point).
const sqlCommittedRanges = `
select first_id, last_id from bill_run_batches where period = $1 order by first_id`

// sqlNextBatch is one keyset step over the period's population (the
// primary key): the next up to $3 ids after $1 and at most $2.
//
// $4 period start, $5 period end, $6 cutoff.
var sqlNextBatch = `
select coalesce(min(id), 0), coalesce(max(id), 0), count(*)
from (select s.id from subscribers s
      where s.id > $1 and s.id <= $2
        and ` + population("$4", "$5", "$6") + `
      order by s.id
      limit $3) s`

// sqlBatchFence is the first part of sqlBatch: it proves that the claim is
// still ours. The row lock FOR SHARE conflicts with a new claim's upsert, so
// either the batch commits before any new claim, or it finds no row and
// writes nothing. It is taken before any subscriber is read (a one-time
// filter on the population), and held only while the statement runs: the
// batch is one statement in its own implicit transaction, so no paused
// client can sit on the lock between statements.
//
// $1 period, $2 claim fence.
const sqlBatchFence = `
with fenced as materialized (
    select r.fence from bill_runs r
    where r.period = $1 and r.fence = $2 and r.status = 'RUNNING'
    for share
)`

// sqlBatch is one batch in one round trip and one implicit transaction:
// the fence check (sqlBatchFence), the invoices of one id range of the
// period's population, and the batch's record in bill_run_batches under
// the claim's fence. When the fence is no longer ours, nothing is written
// and fenced comes back false.
//
// The invoices, set-based: amount = the monthly fee prorated to the days
// the subscriber was active (monthly_fee_cents * active_days /
// days_in_month, rounded half up to the cent; a full month is exactly the
// fee) + the period's usage charges, and usage_cents = that usage. A day
// (in the billing zone) counts when the subscriber was active for any part
// of it: from the day of activated_at (day 1 when NULL or before the
// period) to the day before deactivated_at's instant (a deactivation at
// midnight does not count the day it begins; the last day when NULL or
// after the period). Subscribers already invoiced for the period are
// skipped by ON CONFLICT and counted; a sample of their ids ($5 at most)
// comes back only when there are any.
//
// The shape is chosen to keep its plan good without statistics (a fresh
// table, a generic plan): usage is one index-only probe per subscriber on
// usage_charges_sub_period, and the sample is a hashed EXCEPT, so nothing
// degrades to a nested loop over the whole range.
//
// A batch that committed unseen (the connection broke after the server
// committed, or while it still ran: the server finishes a statement whose
// client is gone) and is sent again fails on its own record's primary key
// (period, first_id) and writes nothing; the retry looks for that record
// (sqlCommittedBatch) before it sends the batch, and again after such a
// conflict.
//
// $1 period, $2 claim fence, $3 first id, $4 last id, $5 sample size,
// $6 period start, $7 period end, $8 cutoff, $9 billing zone, $10 days in
// the period, $11 owner.
var sqlBatch = batchFenceSQL + `,
` + batchInvoicing.rows(`s.id between $3 and $4`) + `,
n as materialized (
    select (select count(*) from fenced) > 0 as fenced,
           (select count(*) from src)        as subscribers,
           (select count(*) from ins)        as created
),
rec as (
    insert into bill_run_batches (period, first_id, last_id, fence, owner, subscribers, invoices_created, already_invoiced)
    select $1, $3, $4, $2, $11, n.subscribers, n.created, n.subscribers - n.created
    from n where n.fenced
)
select n.fenced, n.subscribers, n.created,
       case when n.subscribers > n.created then
           (select array_agg(id order by id)
            from (select id from (select id from src except select subscriber_id from ins) c
                  order by id limit $5) c)
       end
from n`

// invoicing writes a statement's invoices: the parameters (or
// expressions) its rows take, and the column that names the claim writing
// them.
type invoicing struct {
	period, fence, start, end, cutoff, zone, days string
	fenceColumn                                   string // bill_run_fence, or adjust_fence
}

// batchInvoicing is the invoicing of sqlBatch and sqlRepair: $1 period,
// $2 claim fence, $6 period start, $7 period end, $8 cutoff, $9 billing
// zone, $10 days in the period.
var batchInvoicing = invoicing{period: "$1", fence: "$2", start: "$6", end: "$7", cutoff: "$8", zone: "$9", days: "$10",
	fenceColumn: "bill_run_fence"}

// rows is the invoicing as three CTEs after the statement's fence check
// (a CTE named fenced): pop, the population's subscribers that also match
// filter, with their active days and usage; src, their amounts; ins, the
// insert (ON CONFLICT on uidx_invoices_sub_period does nothing), which
// returns the subscribers it invoiced and their amounts.
func (v invoicing) rows(filter string) string {
	return `pop as materialized (
    select s.id, s.monthly_fee_cents,
           case when s.activated_at is null or s.activated_at <= ` + v.start + ` then 1
                else extract(day from s.activated_at at time zone ` + v.zone + `)::int end as first_day,
           case when s.deactivated_at is null or s.deactivated_at >= ` + v.end + ` then ` + v.days + `::int
                else extract(day from (s.deactivated_at - interval '1 microsecond') at time zone ` + v.zone + `)::int end as last_day,
           coalesce((select sum(u.amount_cents) from usage_charges u
                     where u.subscriber_id = s.id and u.period = ` + v.period + `), 0) as usage
    from subscribers s
    where exists (select from fenced)
      and ` + filter + `
      and ` + population(v.start, v.end, v.cutoff) + `
),
src as materialized (
    select id, usage,
           round(monthly_fee_cents::numeric * greatest(last_day - first_day + 1, 0) / ` + v.days + `::int)::bigint + usage as amount
    from pop
),
ins as (
    insert into invoices (subscriber_id, period, amount_cents, usage_cents, ` + v.fenceColumn + `)
    select id, ` + v.period + `, amount, usage, ` + v.fence + ` from src order by id
    on conflict (subscriber_id, period) do nothing
    returning subscriber_id, amount_cents
)`
}

// sqlCommittedBatch finds a batch already recorded under this fence (a
// retried batch whose earlier COMMIT succeeded unseen).
//
// $1 period, $2 first id, $3 fence.
const sqlCommittedBatch = `
select subscribers, invoices_created from bill_run_batches
where period = $1 and first_id = $2 and fence = $3`

// sqlFinish ends the run under its fence: status $3 (COMPLETED, FAILED,
// INTERRUPTED), last_error $4 (NULL when none) and the period's totals
// summed from its committed batches, with the subscribers the reconcile
// repaired ($6, in subscribers and invoices_created too) and the
// population it counted ($7; NULL unless COMPLETED). No row back: the
// fence is no longer ours (a newer claim exists) or the run is no longer
// RUNNING. It returns the period's totals, then this claim's own batches:
// the counts of run.completed come from here, not from the runner's
// memory.
//
// A COMPLETED row also stores the id of the run's run.completed ($5), which
// the template sends once this returns and the resumers re-publish, with the
// same id, if no acknowledgement of it is recorded (completion.go).
//
// $1 period, $2 claim fence, $5 the run's run.completed id.
const sqlFinish = `
update bill_runs r
set status           = $3,
    last_error       = $4,
    completion_event_id = case when $3 = 'COMPLETED' then $5::text end,
    finished_at      = clock_timestamp(),
    updated_at       = clock_timestamp(),
    batches_done     = t.batches,
    batches_total    = case when $3 = 'COMPLETED' then t.batches else r.batches_total end,
    subscribers      = t.subscribers + $6::bigint,
    invoices_created = t.created + $6::bigint,
    already_invoiced = t.already,
    repaired         = $6::bigint,
    population       = $7::bigint
from (select count(*)::integer                          as batches,
             coalesce(sum(subscribers), 0)::bigint      as subscribers,
             coalesce(sum(invoices_created), 0)::bigint as created,
             coalesce(sum(already_invoiced), 0)::bigint as already,
             count(*) filter (where fence = $2)::bigint as fence_batches,
             coalesce(sum(subscribers) filter (where fence = $2), 0)::bigint      as fence_subscribers,
             coalesce(sum(invoices_created) filter (where fence = $2), 0)::bigint as fence_created,
             coalesce(sum(already_invoiced) filter (where fence = $2), 0)::bigint as fence_already
      from bill_run_batches
      where period = $1) t
where r.period = $1 and r.fence = $2 and r.status = 'RUNNING'
returning r.batches_done, r.subscribers, r.invoices_created, r.already_invoiced,
          t.fence_batches, t.fence_subscribers, t.fence_created, t.fence_already`

// sqlCompleteFence opens the completion transaction (complete.go): the
// claim is still ours and stays so until it commits (FOR NO KEY UPDATE
// conflicts with a new claim's upsert, not with the foreign keys of
// bill_run_batches or bill_run_totals). Its settings hold for this
// transaction only:
//
//   - synchronous_commit at least on: the COMMIT that makes the row
//     COMPLETED returns only once the WAL up to it is written (and, where
//     the server names synchronous standbys, replicated), so the completion
//     and everything it reconciled (every batch committed before it) are
//     durable before run.completed goes out, even on a server that
//     acknowledges ordinary commits early (synchronous_commit=off);
//   - idle_in_transaction_session_timeout: a paused client does not hold
//     the row for longer (as in an adjustment);
//   - enable_nestloop off: the reconcile's anti-join is a hash or merge
//     join whatever the statistics say (right after a run they count none
//     of its invoices, and a nested loop over a scan would be quadratic);
//   - jit off: compiling a one-off count costs more than it saves.
//
// $1 period, $2 claim fence, $3 idle-in-transaction timeout.
const sqlCompleteFence = `
select set_config('synchronous_commit',
                  case when current_setting('synchronous_commit') in ('off', 'local') then 'on'
                       else current_setting('synchronous_commit') end, true),
       set_config('idle_in_transaction_session_timeout', $3, true),
       set_config('enable_nestloop', 'off', true),
       set_config('jit', 'off', true)
from bill_runs
where period = $1 and fence = $2 and status = 'RUNNING'
for no key update`

// sqlReconcile counts the period's population at the run's cutoff, those
// of it without an invoice for the period (one anti-join of the
// subscribers against the period's invoices, found by
// invoices_period_brin, 00016, set-based), and the period's invoices: as
// uidx_invoices_sub_period allows one per subscriber, those beyond the
// population's are invoices of subscribers outside it. In the same pass it
// lists the subscribers of the period created after the cutoff that have
// no invoice (the unbilled side of the late check the completion keeps,
// late.go): the population without the cutoff is the same predicate less
// created_at.
//
// $1 period, $2 period start, $3 period end, $4 cutoff.
var sqlReconcile = `
select count(*) filter (where s.created_at <= $4),
       count(*) filter (where s.created_at <= $4 and i.subscriber_id is null),
       (select count(*) from invoices where period = $1),
       coalesce(array_agg(s.id) filter (where s.created_at > $4 and i.subscriber_id is null), '{}')
from subscribers s
left join invoices i on i.subscriber_id = s.id and i.period = $1
where ` + population("$2", "$3", "'infinity'::timestamptz")

// sqlOutsidePopulation lists the first $5 subscriber ids of the period's
// invoices whose subscriber is not in its population at the cutoff (or no
// longer exists).
//
// $1 period, $2 period start, $3 period end, $4 cutoff, $5 most ids.
var sqlOutsidePopulation = `
select coalesce(array_agg(subscriber_id order by subscriber_id), '{}')
from (select i.subscriber_id from invoices i
      where i.period = $1
        and not exists (select from subscribers s where s.id = i.subscriber_id and ` + population("$2", "$3", "$4") + `)
      order by i.subscriber_id
      limit $5) x`

// sqlRepair bills the population's subscribers without an invoice for the
// period, with ids in [$3, $4], under the claim's fence: sqlBatch's fence
// check and invoicing (the same amounts, bill_run_fence = $2), exactly once
// (ON CONFLICT on uidx_invoices_sub_period). It returns whether the fence
// was ours, the invoices it inserted, and their id ranges: the count and
// the first $5. A range is a run of repaired ids with no invoice of the
// period between them (subscribers outside the population may be).
//
// $1 period, $2 claim fence, $3 first id, $4 last id, $5 most ranges
// returned, $6 period start, $7 period end, $8 cutoff, $9 billing zone,
// $10 days in the period.
var sqlRepair = batchFenceSQL + `,
` + batchInvoicing.rows(`s.id between $3 and $4
      and not exists (select from invoices i where i.subscriber_id = s.id and i.period = $1)`) + `,
starts as (
    select x.id, x.prev is null or exists (select from invoices i
                                           where i.period = $1 and i.subscriber_id > x.prev and i.subscriber_id < x.id) as starts
    from (select subscriber_id as id, lag(subscriber_id) over (order by subscriber_id) as prev from ins) x
),
ranges as (
    select min(id) as first_id, max(id) as last_id
    from (select id, count(*) filter (where starts) over (order by id) as g from starts) x
    group by g
),
shown as (select first_id, last_id from ranges order by first_id limit $5)
select (select count(*) from fenced) > 0,
       (select count(*) from ins),
       (select count(*) from ranges),
       coalesce((select array_agg(first_id order by first_id) from shown), '{}'),
       coalesce((select array_agg(last_id order by first_id) from shown), '{}')`
