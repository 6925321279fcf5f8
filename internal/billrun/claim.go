package billrun

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/postgres"
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
func (w *Worker) Claim(ctx context.Context, run *owned.Run, req Request) (int64, error) {
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
	// A dropped connection, a failover or a restart is retried like a
	// batch (MaxBatchAttempts, RetryBackoff): the claim is idempotent under
	// the lock (a claim that committed unseen only costs a fence).
	r := retrier{cfg: w.cfg, log: run.Log()}
	err := r.retry(ctx, "claim", func(ctx context.Context) error {
		return w.pool.QueryRow(ctx, sqlClaim, p.String(), run.Replica(), run.LockFence(),
			t.RequestedBy, t.Principal, t.RequestID, string(t.Source),
			p.Start(cal.Zone), p.End(cal.Zone), cal.Zone.String()).Scan(&fence)
	})
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
			CountRepaired:              st.Counts[CountRepaired],
		}
		if n, ok := st.Counts[CountPopulation]; ok {
			counts[CountPopulation] = n
		}
		// A completed period is checked for usage that arrived since.
		if c, ok := w.reportLateUsage(ctx, run, p); ok {
			c.into(counts)
		}
		return 0, &owned.CompletedError{Owner: st.Owner, Fence: st.Fence, Counts: counts}
	case err != nil:
		return 0, transient(fmt.Errorf("billrun: claim %s: %w", p, err))
	}
	// The base the completion's late check starts from (late.go). Without
	// it the first trigger after the completion checks in full.
	if _, err := w.pool.Exec(ctx, sqlLateBase, p.String()); err != nil {
		run.Log().Warn("billrun_late_base_not_kept", "period", p.String(), "error", err)
	}
	return fence, nil
}

// AlreadyCompleted answers, before the lock, a trigger for a period whose
// bill run is COMPLETED (owned.Worker.AlreadyCompleted): one statement reads the
// row and checks the late usage from the period's kept check (late.go), by
// index, never reading the period's invoices. The answer is the one Claim
// gives under the lock: the run that completed it, the period's totals,
// the late usage and unbilled subscribers (billrun.late_usage when there
// are any).
//
// nil, nil sends the trigger the locked way, which decides as before: an
// adjustment run (it takes the lock), a period that is not closed (Claim
// refuses it), no row or a row that is not COMPLETED (Claim takes it), an
// adjustment run RUNNING (it holds the lock), or no kept check for the
// row's fence (Claim checks in full and keeps it).
//
// Safe without the lock because COMPLETED is final for a trigger: nothing
// the coordinator does sets a COMPLETED row back (sqlClaim leaves it
// alone), so an answer read from a COMPLETED row is what Claim would have
// answered at that instant. A row set back by hand is read as it is: the
// triggers that read it COMPLETED before the change were answered as
// before it, as under the lock; those after it go the locked way.
func (w *Worker) AlreadyCompleted(ctx context.Context, run *owned.Run, req Request) (*owned.CompletedError, error) {
	p := req.Period
	if req.Adjust || !p.Valid() || !w.cfg.Calendar.Closed(p) {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, lateUsageTimeout)
	defer cancel()
	s, err := w.readLate(ctx, p)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	case s.status != StatusCompleted || s.adjusting || !s.cached:
		return nil, nil
	}
	w.refreshLate(ctx, run, p, s)
	w.reportLate(ctx, run, p, s.check, lateHowKept)
	counts := s.counts
	s.check.into(counts)
	return &owned.CompletedError{Owner: s.owner, Fence: s.fence, Counts: counts}, nil
}

// transient marks err retryable for the template (owned.Retryable) when
// Postgres says its cause is transient (postgres.IsTransient: a lost
// connection, admin shutdown, serialization failure, deadlock): the
// resumer tries the run again. Lost errors and nil pass unchanged.
func transient(err error) error {
	if err == nil || errors.Is(err, owned.ErrLost) || !postgres.IsTransient(err) {
		return err
	}
	return owned.Retryable(err)
}

// Incomplete lists the periods whose bill run was accepted and is not
// COMPLETED (RUNNING, whose owner may be gone; INTERRUPTED; FAILED), for
// the resumer (owned.Worker.Incomplete). A RUNNING row whose owner still holds the
// lock is listed too; the resumer finds the lock held.
func (w *Worker) Incomplete(ctx context.Context) ([]owned.Incomplete[Request], error) {
	rows, err := w.pool.Query(ctx, sqlIncomplete)
	if err != nil {
		return nil, fmt.Errorf("billrun: list incomplete runs: %w", err)
	}
	defer rows.Close()
	var out []owned.Incomplete[Request]
	for rows.Next() {
		var (
			period, status, requestID, requestedBy, source string
			since                                          time.Time
		)
		if err := rows.Scan(&period, &status, &since, &requestID, &requestedBy, &source); err != nil {
			return nil, fmt.Errorf("billrun: list incomplete runs: %w", err)
		}
		p, err := ParsePeriod(period)
		if err != nil {
			continue // the table's check constraint makes this unreachable
		}
		// Force: the run was admitted when it was first claimed; the age
		// limit must not stop its resumption (closed is checked again).
		out = append(out, owned.Incomplete[Request]{Params: Request{Period: p, Force: true}, Since: since, State: status,
			Trigger: job.Trigger{Source: job.Source(source), RequestID: requestID, RequestedBy: requestedBy}})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("billrun: list incomplete runs: %w", err)
	}
	return out, nil
}
