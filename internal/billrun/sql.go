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
// $1 period, $2 owner, $3 lock fence, $4 requested_by, $5 principal,
// $6 request_id, $7 trigger source.
const sqlClaim = `
insert into bill_runs as r (period, status, owner, fence, lock_fence, attempts, started_at, updated_at,
                            requested_by, principal, request_id, trigger_source)
values ($1, 'RUNNING', $2, 1, $3, 1, clock_timestamp(), clock_timestamp(),
        nullif($4, ''), nullif($5, ''), nullif($6, ''), nullif($7, ''))
on conflict (period) do update
set status         = 'RUNNING',
    owner          = excluded.owner,
    fence          = r.fence + 1,
    lock_fence     = excluded.lock_fence,
    attempts       = r.attempts + 1,
    started_at     = clock_timestamp(),
    finished_at    = null,
    last_error     = null,
    updated_at     = clock_timestamp(),
    requested_by   = excluded.requested_by,
    principal      = excluded.principal,
    request_id     = excluded.request_id,
    trigger_source = excluded.trigger_source
where r.status <> 'COMPLETED'
  and (r.lock_fence is null or r.lock_fence <= excluded.lock_fence)
returning r.fence`

// sqlIncomplete lists the periods whose run is not COMPLETED, with when
// the latest claim started and its trigger (the resumer's view).
const sqlIncomplete = `
select period, status, coalesce(started_at, updated_at), coalesce(request_id, ''), coalesce(requested_by, ''),
       coalesce(trigger_source, '')
from bill_runs
where status <> 'COMPLETED'
order by period`

// sqlStatus reads a period's row with totals summed from its committed
// batches, and for its progress: the batches and subscribers of the latest
// claim (fence) and the seconds it has run, by the database's clock.
const sqlStatus = `
select r.period, r.status, coalesce(r.owner, ''), r.fence, r.lock_fence, r.attempts,
       r.started_at, r.finished_at, r.updated_at, coalesce(r.last_error, ''),
       coalesce(r.requested_by, ''), coalesce(r.principal, ''), coalesce(r.request_id, ''), coalesce(r.trigger_source, ''),
       t.batches, t.subscribers, t.created, t.already,
       r.batches_total, t.fence_batches, t.fence_subscribers,
       coalesce(extract(epoch from coalesce(r.finished_at, clock_timestamp()) - r.started_at), 0)::float8
from bill_runs r,
     lateral (select count(*)                           as batches,
                     coalesce(sum(b.subscribers), 0)      as subscribers,
                     coalesce(sum(b.invoices_created), 0) as created,
                     coalesce(sum(b.already_invoiced), 0) as already,
                     count(*) filter (where b.fence = r.fence)                        as fence_batches,
                     coalesce(sum(b.subscribers) filter (where b.fence = r.fence), 0) as fence_subscribers
              from bill_run_batches b
              where b.period = r.period) t
where r.period = $1`

// sqlCountToPlan estimates what a run still has to plan: the ACTIVE
// subscribers (index-only on subscribers_active_id; keep the predicate in
// step with sqlNextBatch's) less those in the period's committed batches
// (as they were counted when committed).
//
// $1 period.
const sqlCountToPlan = `
select (select count(*) from subscribers where status = 'ACTIVE')
     - (select coalesce(sum(subscribers), 0) from bill_run_batches where period = $1)`

// sqlRecordTotal stores the run's batches_total (the progress denominator)
// while the claim is ours.
//
// $1 period, $2 claim fence, $3 batches in all.
const sqlRecordTotal = `
update bill_runs set batches_total = $3
where period = $1 and fence = $2 and status = 'RUNNING'`

// sqlCommittedRanges lists the batches already committed for a period (the
// resume point).
const sqlCommittedRanges = `
select first_id, last_id from bill_run_batches where period = $1 order by first_id`

// sqlNextBatch is one keyset step over ACTIVE subscribers (index-only on the
// partial index subscribers_active_id): the next up to $3 ids after $1 and
// at most $2.
const sqlNextBatch = `
select coalesce(min(id), 0), coalesce(max(id), 0), count(*)
from (select id from subscribers
      where status = 'ACTIVE' and id > $1 and id <= $2
      order by id
      limit $3) s`

// sqlFenceCheck proves, inside a batch transaction, that the claim is still
// ours: the row lock FOR SHARE conflicts with a new claim's upsert, so either
// this transaction commits before any new claim, or it finds no row and
// aborts. It also bounds how long a paused process may sit idle inside the
// transaction holding that lock ($3, e.g. '10s').
//
// $1 period, $2 claim fence, $3 idle-in-transaction timeout.
const sqlFenceCheck = `
select r.fence, set_config('idle_in_transaction_session_timeout', $3, true)
from bill_runs r
where r.period = $1 and r.fence = $2 and r.status = 'RUNNING'
for share`

// sqlInsertInvoices bills the ACTIVE subscribers of one id range, set-based:
// amount = monthly fee + the period's usage charges. Subscribers already
// invoiced for the period are skipped by ON CONFLICT and counted; a sample of
// their ids ($5 at most) comes back only when there are any.
//
// The shape is chosen to keep its plan good without statistics (a fresh
// table, a generic plan): usage is one index-only probe per subscriber on
// usage_charges_sub_period, and the sample is a hashed EXCEPT, so nothing
// degrades to a nested loop over the whole range.
//
// $1 period, $2 claim fence, $3 first id, $4 last id, $5 sample size.
const sqlInsertInvoices = `
with src as materialized (
    select s.id,
           s.monthly_fee_cents + coalesce((select sum(u.amount_cents) from usage_charges u
                                           where u.subscriber_id = s.id and u.period = $1), 0) as amount
    from subscribers s
    where s.status = 'ACTIVE' and s.id between $3 and $4
),
ins as (
    insert into invoices (subscriber_id, period, amount_cents, bill_run_fence)
    select id, $1, amount, $2 from src order by id
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

// sqlCommittedBatch finds a batch already recorded under this fence (a
// retried batch whose earlier COMMIT succeeded unseen).
//
// $1 period, $2 first id, $3 fence.
const sqlCommittedBatch = `
select subscribers, invoices_created from bill_run_batches
where period = $1 and first_id = $2 and fence = $3`

// sqlRecordBatch marks one range committed under the claim's fence.
//
// $1 period, $2 first id, $3 last id, $4 fence, $5 owner, $6 subscribers,
// $7 invoices created, $8 already invoiced.
const sqlRecordBatch = `
insert into bill_run_batches (period, first_id, last_id, fence, owner, subscribers, invoices_created, already_invoiced)
values ($1, $2, $3, $4, $5, $6, $7, $8)`

// sqlFinish ends the run under its fence: status $3 (COMPLETED, FAILED,
// INTERRUPTED), last_error $4 (NULL when none) and the period's totals
// summed from its committed batches. No row back: the fence is no longer
// ours (a newer claim exists) or the run is no longer RUNNING.
//
// $1 period, $2 claim fence.
const sqlFinish = `
update bill_runs r
set status           = $3,
    last_error       = $4,
    finished_at      = clock_timestamp(),
    updated_at       = clock_timestamp(),
    batches_done     = t.batches,
    batches_total    = case when $3 = 'COMPLETED' then t.batches else r.batches_total end,
    subscribers      = t.subscribers,
    invoices_created = t.created,
    already_invoiced = t.already
from (select count(*)::integer                          as batches,
             coalesce(sum(subscribers), 0)::bigint      as subscribers,
             coalesce(sum(invoices_created), 0)::bigint as created,
             coalesce(sum(already_invoiced), 0)::bigint as already
      from bill_run_batches
      where period = $1) t
where r.period = $1 and r.fence = $2 and r.status = 'RUNNING'
returning r.batches_done, r.subscribers, r.invoices_created, r.already_invoiced`
