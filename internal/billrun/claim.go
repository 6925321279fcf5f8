package billrun

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// Claim takes the period's bill_runs row for this replica under the lock,
// in one statement (sqlClaim): a new or unfinished row gets fence+1, this
// owner, status RUNNING and the lock's fencing token, and records who
// asked (requested_by, principal, request_id, trigger_source); every batch
// of the run proves that fence. A COMPLETED row is left alone: the answer is an
// *owned.CompletedError naming the run that completed it, with the
// period's totals. A row that records a higher lock fence (a newer holder's
// claim) is left alone too: the answer is an *owned.LostError, reason
// fence_lost.
//
// A period that is not closed in the billing zone is refused here too
// (period_not_closed), whoever calls: the transports refuse it as they
// decode, this is the backstop. The first claim records the population
// cutoff (the period's instants in the billing zone, the zone, the claim
// time); a resume keeps it.
func (w *Worker) Claim(ctx context.Context, run *owned.Run, params owned.Params) (int64, error) {
	req := requestOf(params)
	p := req.Period
	if !p.Valid() {
		return 0, job.BadInput("period %q is outside %d-01..%d-12", p.String(), MinYear, MaxYear)
	}
	cal := w.cfg.Calendar
	if !cal.Closed(p) {
		return 0, cal.Admit(p, true)
	}
	if req.Adjust {
		return w.claimAdjust(ctx, run, p)
	}
	var fence int64
	t := run.Trigger()
	err := w.pool.QueryRow(ctx, sqlClaim, p.String(), run.Replica(), run.LockFence(),
		t.RequestedBy, t.Principal, t.RequestID, string(t.Source),
		p.Start(cal.Zone), p.End(cal.Zone), cal.Zone.String()).Scan(&fence)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		st, serr := ReadStatus(ctx, w.pool, p)
		switch {
		case serr != nil:
			return 0, fmt.Errorf("billrun: claim %s found no claimable row, and its status could not be read: %w", p, serr)
		case st.Status != StatusCompleted:
			// The row records a higher lock fence: a newer holder of the
			// lock claimed the run, so this one's lease is stale (lost
			// without noticing, e.g. across a failover or a pause).
			return 0, owned.Lost(ReasonFenceLost, fmt.Errorf("billrun: claim %s: lock fence %d is below the lock fence %d of %s's claim",
				p, run.LockFence(), st.LockFence, st.Owner))
		}
		counts := map[string]int64{
			CountPeriodBatches:         st.Counts[CountBatchesCommitted],
			CountPeriodSubscribers:     st.Counts[CountSubscribers],
			CountPeriodInvoicesCreated: st.Counts[CountInvoicesCreated],
			CountPeriodAlreadyInvoiced: st.Counts[CountAlreadyInvoiced],
		}
		// A completed period is checked for usage that arrived since.
		if subs, cents, ok := w.reportLateUsage(ctx, run, p); ok {
			counts[CountLateUsageSubscribers], counts[CountLateUsageCents] = subs, cents
		}
		return 0, &owned.CompletedError{Owner: st.Owner, Fence: st.Fence, Counts: counts}
	case err != nil:
		return 0, fmt.Errorf("billrun: claim %s: %w", p, err)
	}
	return fence, nil
}
