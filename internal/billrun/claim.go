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
// period's totals.
func (w *Worker) Claim(ctx context.Context, run *owned.Run, params owned.Params) (int64, error) {
	p := params.(Period)
	if !p.Valid() {
		return 0, job.BadInput("period %q is outside %d-01..%d-12", p.String(), MinYear, MaxYear)
	}
	var fence int64
	t := run.Trigger()
	err := w.pool.QueryRow(ctx, sqlClaim, p.String(), run.Replica(), run.LockFence(),
		t.RequestedBy, t.Principal, t.RequestID, string(t.Source)).Scan(&fence)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		st, serr := ReadStatus(ctx, w.pool, p)
		if serr != nil || st.Status != StatusCompleted {
			return 0, fmt.Errorf("billrun: claim found no claimable row and status read failed: %v", serr)
		}
		return 0, &owned.CompletedError{Owner: st.Owner, Fence: st.Fence, Counts: map[string]int64{
			CountPeriodBatches:         st.Counts[CountBatchesCommitted],
			CountPeriodSubscribers:     st.Counts[CountSubscribers],
			CountPeriodInvoicesCreated: st.Counts[CountInvoicesCreated],
			CountPeriodAlreadyInvoiced: st.Counts[CountAlreadyInvoiced],
		}}
	case err != nil:
		return 0, fmt.Errorf("billrun: claim %s: %w", p, err)
	}
	return fence, nil
}
