package billrun

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// Late usage and adjustment runs.
//
// An invoice written by a bill run records the usage it billed
// (invoices.usage_cents). Usage of the period that arrives later is the
// difference between the subscriber's usage_charges for the period and
// what the invoice and earlier adjustments cover: an amount, not a set of
// rows, so it does not matter in which order usage transactions committed.
// Invoices without usage_cents (other writers', or written before it
// existed) count as covering all usage.
//
// A subscriber of the period with no invoice at all (loaded after the bill
// run's cutoff, or backdated into the period after its batch) is billed by
// the adjustment run too: an invoice like a bill run's (prorated fee and
// the period's usage), adjust_fence = the adjustment claim's fence, exactly
// once (uidx_invoices_sub_period). "Of the period" is the bill run's
// population predicate over the period's recorded instants and zone,
// without the cutoff.

// Counts keys of an adjustment run, and of a late-usage check.
const (
	CountAdjustmentsCreated   = "adjustments_created"    // invoice_adjustments rows this adjustment run inserted
	CountAdjustedCents        = "adjusted_cents"         // their amount
	CountLateUsageSubscribers = "late_usage_subscribers" // subscribers with usage no invoice or adjustment covers
	CountLateUsageCents       = "late_usage_cents"       // that usage's amount
	// CountUnbilledSubscribers: subscribers of a COMPLETED period with no
	// invoice for it (loaded or backdated into it after the bill run). An
	// adjustment run's invoices_created (CountInvoicesCreated) bills them;
	// invoiced_cents is those invoices' amount.
	CountUnbilledSubscribers = "unbilled_subscribers"
	CountInvoicedCents       = "invoiced_cents"
)

// sqlClaimAdjust claims the period's adjustment run: only once its bill run
// is COMPLETED, with fence+1 on every claim (an adjustment run may be run
// again when more usage arrives), refused to a lock fence below the one
// recorded (a stale holder). No row: no COMPLETED bill run, or a stale
// holder.
//
// $1 period, $2 owner, $3 lock fence.
const sqlClaimAdjust = `
insert into bill_run_adjustments as a (period, status, owner, fence, lock_fence, attempts, started_at, updated_at)
select $1, 'RUNNING', $2, 1, $3, 1, clock_timestamp(), clock_timestamp()
from bill_runs r
where r.period = $1 and r.status = 'COMPLETED'
on conflict (period) do update
set status      = 'RUNNING',
    owner       = excluded.owner,
    fence       = a.fence + 1,
    lock_fence  = excluded.lock_fence,
    attempts    = a.attempts + 1,
    started_at  = clock_timestamp(),
    finished_at = null,
    last_error  = null,
    updated_at  = clock_timestamp()
where a.lock_fence is null or a.lock_fence <= excluded.lock_fence
returning a.fence`

// sqlAdjustFence proves, inside the adjustment transaction, that the claim
// is still ours (FOR SHARE conflicts with a new claim's upsert). Like the
// bill run's completion (sqlCompleteFence), the transaction commits with
// synchronous_commit at least on: its invoices and adjustments are
// reported once it commits, and nothing runs an adjustment again, so a
// server that acknowledges commits early must not lose them.
//
// $1 period, $2 claim fence, $3 idle-in-transaction timeout.
const sqlAdjustFence = `
select a.fence, set_config('idle_in_transaction_session_timeout', $3, true),
       set_config('synchronous_commit',
                  case when current_setting('synchronous_commit') in ('off', 'local') then 'on'
                       else current_setting('synchronous_commit') end, true)
from bill_run_adjustments a
where a.period = $1 and a.fence = $2 and a.status = 'RUNNING'
for share`

// sqlInsertAdjustments invoices the period's late usage, one row per
// subscriber under this claim's fence (unique key: subscriber, period,
// fence), set-based.
//
// $1 period, $2 claim fence.
const sqlInsertAdjustments = `
with late as materialized (
    select i.subscriber_id, u.total - i.usage_cents - coalesce(a.adjusted, 0) as amount
    from invoices i
    cross join lateral (select coalesce(sum(c.amount_cents), 0) as total from usage_charges c
                        where c.subscriber_id = i.subscriber_id and c.period = i.period) u
    cross join lateral (select sum(x.amount_cents) as adjusted from invoice_adjustments x
                        where x.subscriber_id = i.subscriber_id and x.period = i.period) a
    where i.period = $1 and i.usage_cents is not null
),
ins as (
    insert into invoice_adjustments (subscriber_id, period, amount_cents, adjust_fence)
    select subscriber_id, $1, amount, $2 from late where amount <> 0 order by subscriber_id
    on conflict (subscriber_id, period, adjust_fence) do nothing
    returning amount_cents
)
select count(*), coalesce(sum(amount_cents), 0)::bigint from ins`

// sqlFinishAdjust ends the adjustment claim under its fence.
//
// $1 period, $2 claim fence, $3 status, $4 last error, $5 adjustments, $6
// cents, $7 invoices of unbilled subscribers.
const sqlFinishAdjust = `
update bill_run_adjustments
set status       = $3,
    last_error   = $4,
    adjustments  = adjustments + $5,
    amount_cents = amount_cents + $6,
    invoices_created = invoices_created + $7,
    finished_at  = clock_timestamp(),
    updated_at   = clock_timestamp()
where period = $1 and fence = $2 and status = 'RUNNING'`

// adjustInvoicing is the invoicing of sqlAdjustInvoices: $1 period, $2
// adjustment fence, $3 period start, $4 period end, $5 billing zone, $6
// days in the period; no cutoff.
var adjustInvoicing = invoicing{period: "$1", fence: "$2", start: "$3", end: "$4", cutoff: "'infinity'::timestamptz",
	zone: "$5", days: "$6", fenceColumn: "adjust_fence"}

// sqlAdjustInvoices bills the period's subscribers with no invoice for it,
// inside the adjustment transaction, under its fence (the claim held FOR
// SHARE), exactly once: the bill run's invoicing, adjust_fence = $2.
var sqlAdjustInvoices = `
with fenced as materialized (
    select a.fence from bill_run_adjustments a
    where a.period = $1 and a.fence = $2 and a.status = 'RUNNING'
    for share
),
` + adjustInvoicing.rows(`not exists (select from invoices i where i.subscriber_id = s.id and i.period = $1)`) + `
select count(*), coalesce(sum(amount_cents), 0)::bigint from ins`

// sqlPeriodInstants reads the period's instants and zone as the bill run
// recorded them (NULLs on a row claimed before they were).
const sqlPeriodInstants = `select period_start, period_end, billing_tz from bill_runs where period = $1`

// instants are p's start and end and its zone's name as its bill run
// recorded them, else as the calendar has them now.
func (w *Worker) instants(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, p Period) (start, end time.Time, zone string, err error) {
	var s, e *time.Time
	var z *string
	if err := q.QueryRow(ctx, sqlPeriodInstants, p.String()).Scan(&s, &e, &z); err != nil {
		return time.Time{}, time.Time{}, "", err
	}
	if s == nil || e == nil || z == nil {
		zone := w.cfg.Calendar.Zone
		return p.Start(zone), p.End(zone), zone.String(), nil
	}
	return *s, *e, *z, nil
}

// lateUsageTimeout bounds the late-usage check of an already_completed
// answer or of an adjustment run's end.
const lateUsageTimeout = 10 * time.Second

// lateCheck is what reportLateUsage found.
type lateCheck struct {
	subscribers, cents, unbilled int64
}

// into puts the check's counts into counts.
func (c lateCheck) into(counts map[string]int64) {
	counts[CountLateUsageSubscribers], counts[CountLateUsageCents] = c.subscribers, c.cents
	counts[CountUnbilledSubscribers] = c.unbilled
}

// reportLateUsage checks a COMPLETED period for late usage and unbilled
// subscribers when a trigger finds it completed: billrun.late_usage when
// there is either, and the gauge either way. Best effort: a failed or
// timed-out check is logged and ok is false.
func (w *Worker) reportLateUsage(ctx context.Context, run *owned.Run, p Period) (lateCheck, bool) {
	ctx, cancel := context.WithTimeout(ctx, lateUsageTimeout)
	defer cancel()
	c, how, err := w.lateUsage(ctx, run, p)
	if err != nil {
		run.Log().Warn("billrun_late_usage_check_failed", "period", p.String(), "error", err)
		return lateCheck{}, false
	}
	w.reportLate(ctx, run, p, c, how)
	return c, true
}

// reportLate says what a late check found: billrun.late_usage when there
// is late usage or an unbilled subscriber, the gauge either way.
func (w *Worker) reportLate(ctx context.Context, run *owned.Run, p Period, c lateCheck, how string) {
	w.cfg.Metrics.lateUsageChecked(p, c.subscribers, how)
	if c.subscribers == 0 && c.unbilled == 0 {
		return
	}
	run.Log().Warn("billrun_late_usage", "period", p.String(), CountLateUsageSubscribers, c.subscribers, CountLateUsageCents, c.cents,
		CountUnbilledSubscribers, c.unbilled)
	run.Emit(ctx, events.BillrunLateUsage, map[string]any{
		"period": p.String(), CountLateUsageSubscribers: c.subscribers, CountLateUsageCents: c.cents,
		CountUnbilledSubscribers: c.unbilled,
		"adjust":                 fmt.Sprintf("coordinator run billrun --period %s --adjust", p),
	})
}

// claimAdjust claims p's adjustment run. Without a COMPLETED bill run the
// answer is bad input: there is nothing to adjust yet.
func (w *Worker) claimAdjust(ctx context.Context, run *owned.Run, p Period) (int64, error) {
	var fence int64
	err := w.pool.QueryRow(ctx, sqlClaimAdjust, p.String(), run.Replica(), run.LockFence()).Scan(&fence)
	if errors.Is(err, pgx.ErrNoRows) {
		st, serr := ReadStatus(ctx, w.pool, p)
		switch {
		case errors.Is(serr, ErrNotFound):
			return 0, job.BadInput("period %s has no bill run: run it first; an adjustment run invoices usage that arrived after it COMPLETED", p)
		case serr != nil:
			return 0, fmt.Errorf("billrun: adjustment claim %s refused and status read failed: %w", p, serr)
		case st.Status != StatusCompleted:
			return 0, job.BadInput("period %s's bill run is %s, not COMPLETED: finish it first (an adjustment run invoices usage that arrived after it COMPLETED)", p, st.Status)
		}
		return 0, owned.Lost(ReasonFenceLost, fmt.Errorf("billrun: adjustment claim %s: a newer lock holder claimed it", p))
	}
	if err != nil {
		return 0, fmt.Errorf("billrun: adjustment claim %s: %w", p, err)
	}
	return fence, nil
}

// adjusted is what an adjustment transaction wrote.
type adjusted struct {
	adjustments, adjustedCents int64 // late usage
	invoices, invoicedCents    int64 // unbilled subscribers
}

// runAdjust bills p's unbilled subscribers and invoices its late usage in
// one fenced transaction, then reports what is left (normally nothing).
func (w *Worker) runAdjust(ctx context.Context, run *owned.Run, p Period) (owned.Report, error) {
	r := retrier{cfg: w.cfg, log: run.Log()}
	var a adjusted
	err := r.retry(ctx, "adjust", func(ctx context.Context) error {
		var err error
		a, err = w.adjustOnce(ctx, p, run.Fence())
		return err
	})
	counts := map[string]int64{CountAdjustmentsCreated: a.adjustments, CountAdjustedCents: a.adjustedCents,
		CountInvoicesCreated: a.invoices, CountInvoicedCents: a.invoicedCents}
	if err == nil {
		w.cfg.Metrics.adjusted(a.adjustments)
		w.cfg.Metrics.adjustmentInvoices(a.invoices)
		run.Log().Info("billrun_adjusted", "period", p.String(), CountAdjustmentsCreated, a.adjustments, CountAdjustedCents, a.adjustedCents,
			CountInvoicesCreated, a.invoices, CountInvoicedCents, a.invoicedCents)
		if c, ok := w.reportLateUsage(ctx, run, p); ok {
			c.into(counts)
		}
		return owned.Report{Counts: counts}, nil
	}
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	status, msg := StatusFailed, err.Error()
	switch {
	case errors.Is(err, errFenceLost):
		return owned.Report{Counts: counts}, owned.Lost(ReasonFenceLost, nil)
	case ctx.Err() != nil:
		status, msg = StatusInterrupted, "interrupted"
	}
	if _, ferr := w.pool.Exec(endCtx, sqlFinishAdjust, p.String(), run.Fence(), status, msg, 0, 0, 0); ferr != nil {
		run.Log().Warn("billrun_mark_adjustment_failed", "error", ferr)
	}
	return owned.Report{Counts: counts}, fmt.Errorf("billrun: adjustment run %s: %w", p, err)
}

// adjustOnce is the adjustment transaction: prove the fence, bill the
// unbilled subscribers, insert the late usage's adjustments (after the new
// invoices, which cover their own usage), end the claim COMPLETED, commit.
// The counts are what the statements report.
func (w *Worker) adjustOnce(ctx context.Context, p Period, fence int64) (adjusted, error) {
	var a adjusted
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return a, err
	}
	defer func() {
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rbCtx) // no-op after Commit
	}()
	var got int64
	var idle, syncCommit string
	err = tx.QueryRow(ctx, sqlAdjustFence, p.String(), fence, w.cfg.IdleInTransactionTimeout.String()).Scan(&got, &idle, &syncCommit)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, errFenceLost
	}
	if err != nil {
		return a, err
	}
	start, end, zone, err := w.instants(ctx, tx, p)
	if err != nil {
		return a, err
	}
	if err := tx.QueryRow(ctx, sqlAdjustInvoices, p.String(), fence, start, end, zone, p.Days()).
		Scan(&a.invoices, &a.invoicedCents); err != nil {
		return a, err
	}
	if err := tx.QueryRow(ctx, sqlInsertAdjustments, p.String(), fence).Scan(&a.adjustments, &a.adjustedCents); err != nil {
		return a, err
	}
	tag, err := tx.Exec(ctx, sqlFinishAdjust, p.String(), fence, StatusCompleted, nil, a.adjustments, a.adjustedCents, a.invoices)
	if err != nil {
		return a, err
	}
	if tag.RowsAffected() != 1 {
		return a, errFenceLost
	}
	return a, tx.Commit(ctx)
}
