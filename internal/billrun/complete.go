package billrun

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/telco-platform/coordinator/internal/postgres"
)

// Completion is a proof (issue 23). A run's memory says which batches it
// saw commit; a Postgres that acknowledges commits before they are durable
// (synchronous_commit=off, a failover to an asynchronous replica) may lose
// the last of them and come back without them, while the run goes on past
// their ranges. So a run whose batches are all done is COMPLETED only by
// one transaction, under its fence (complete), that
//
//  1. reconciles (reconcile): counts the period's population at the cutoff
//     and those of it with no invoice for the period, in the database, one
//     set-based anti-join (sqlReconcile);
//  2. repairs a gap: bills the missing subscribers under the same fence,
//     with the batch statement's fence check and invoicing, exactly once
//     (sqlRepair; uidx_invoices_sub_period), and counts them again: none may
//     be left;
//  3. marks the row COMPLETED with the period's totals and this claim's
//     counts read back from the database (sqlFinish), and commits with
//     synchronous_commit on, so the completion and everything before it is
//     durable before run.completed goes out.
//
// The transaction reads one snapshot (REPEATABLE READ), so the three steps
// see the same population: a subscriber that changes into it meanwhile is
// a change after the run, not a gap the repair left open. Transient errors
// (a dropped connection, a serialization failure) try it again whole; a
// superseded fence or a gap left open ends it at once (transientErr).
//
// A gap that cannot be repaired (the repair fails, or subscribers are still
// missing after it) rolls the transaction back: the run is FAILED, a
// retryable failure the resumer retries, and it pages
// (coordinator_billrun_reconcile_failures_total,
// CoordinatorBillRunUnreconciled).

// completeTimeout bounds the completion transaction, retries included: the
// reconcile reads the whole population (about 1 s per million subscribers,
// BENCHMARKS.md).
const completeTimeout = 5 * time.Minute

// maxRepairRanges bounds the id ranges a repair logs.
const maxRepairRanges = 20

// maxOutsideIDs bounds the subscriber ids of invoices outside the
// population a completion logs.
const maxOutsideIDs = 20

// reconciliation is what a run's reconcile found and did.
type reconciliation struct {
	population int64   // the population at the cutoff
	missing    int64   // of it, subscribers without an invoice before the repair
	unbilled   []int64 // subscribers of the period created after the cutoff, with no invoice
	repaired   int64   // invoices the repair inserted
	ranges     int64   // id ranges of the repaired subscribers
	shown      [][2]int64
	outside    int64   // the period's invoices of subscribers outside the population
	outsideIDs []int64 // the first of them
	took       time.Duration
}

// UnreconciledError is a run whose batches are all done but whose period's
// invoices are not its population, and the repair could not make them so.
// The run is not COMPLETED.
type UnreconciledError struct {
	Period  Period
	Missing int64 // population members still without an invoice (0: the repair itself failed)
	Err     error // the repair's error, if it failed
}

func (e *UnreconciledError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("billrun: %s not completed: the reconcile could not bill the population's missing subscribers: %v", e.Period, e.Err)
	}
	return fmt.Sprintf("billrun: %s not completed: %d subscriber(s) of the population still have no invoice after the repair", e.Period, e.Missing)
}

func (e *UnreconciledError) Unwrap() error { return e.Err }

// errNotOurs: the completion found the claim fence superseded.
var errNotOurs = errors.New("billrun: claim fence superseded at completion")

// complete is the completion transaction (see above), retried whole after
// transient errors until ctx ends. ok false: the fence is no longer ours.
// It returns the counts of run.completed, from the database.
func (x *execution) complete(ctx context.Context, planned int64) (counts map[string]int64, rec reconciliation, ok bool, err error) {
	err = x.retryUntil(ctx, "complete", func(ctx context.Context) error {
		var e error
		counts, rec, e = x.completeOnce(ctx, planned)
		return e
	})
	switch {
	case errors.Is(err, errNotOurs):
		return nil, rec, false, nil
	case err != nil:
		return nil, rec, false, err
	}
	return counts, rec, true, nil
}

func (x *execution) completeOnce(ctx context.Context, planned int64) (map[string]int64, reconciliation, error) {
	var rec reconciliation
	// One snapshot for the reconcile, the repair, the count after it and the
	// totals: a subscriber that changes into the population while the
	// completion runs is a change after the cutoff (the adjustment run's),
	// not a gap the repair left open. A conflicting invoice committed since
	// the snapshot is a serialization failure: transient, the completion is
	// tried again.
	tx, err := x.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return nil, rec, err
	}
	defer func() {
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rbCtx) // no-op after Commit
	}()
	var s1, s2, s3, s4 string
	err = tx.QueryRow(ctx, sqlCompleteFence, x.period.String(), x.fence, x.cfg.IdleInTransactionTimeout.String()).
		Scan(&s1, &s2, &s3, &s4)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, rec, errNotOurs
	}
	if err != nil {
		return nil, rec, err
	}
	// The late check the completion keeps (late.go) is as of a snapshot
	// taken before the reconcile, whose statements all see at least as much.
	var snap string
	if err := tx.QueryRow(ctx, `select pg_current_snapshot()::text`).Scan(&snap); err != nil {
		return nil, rec, err
	}
	if !reconcileSkipped { // chaos_sabotage builds only (sabotage.go)
		if rec, err = x.reconcile(ctx, tx); err != nil {
			return nil, rec, err
		}
		if err := keepAtCompletion(ctx, tx, x.period, x.fence, snap, rec.unbilled); err != nil {
			if postgres.IsTransient(err) {
				return nil, rec, err
			}
			// Not kept: the first trigger for the period checks in full.
			x.log.Warn("billrun_late_check_not_kept", "period", x.period.String(), "error", err)
		}
	}
	var population *int64
	if !reconcileSkipped {
		population = &rec.population
	}
	var t finishTotals
	err = tx.QueryRow(ctx, sqlFinish, x.period.String(), x.fence, StatusCompleted, nil, x.run.CompletionEventID(),
		rec.repaired, population).Scan(t.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, rec, errNotOurs
	}
	if err != nil {
		return nil, rec, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, rec, err
	}
	counts := t.counts()
	counts[CountRepaired] = rec.repaired
	counts[CountSubscribers] += rec.repaired
	counts[CountInvoicesCreated] += rec.repaired
	if population != nil {
		counts[CountPopulation] = rec.population
		counts[CountOutsidePopulation] = rec.outside
	}
	if unrecorded := planned - t.periodBatches; unrecorded > 0 {
		// Batches the run saw commit are not in bill_run_batches: their
		// commits were lost (the reconcile billed their subscribers).
		x.log.Warn("billrun_batches_unrecorded", "planned", planned, "recorded", t.periodBatches, "unrecorded", unrecorded)
	}
	return counts, rec, nil
}

// reconcile proves, inside the completion transaction, that the period's
// invoices cover its population at the cutoff, and repairs a gap: see the
// top of this file. A gap it cannot close is an *UnreconciledError; a
// transient error is returned as it is (the transaction is retried).
//
// The chaos verifier's sabotage build skips this step (reconcileSkipped,
// sabotage_chaos.go) to prove that its check notices.
func (x *execution) reconcile(ctx context.Context, tx pgx.Tx) (reconciliation, error) {
	var rec reconciliation
	began := time.Now()
	defer func() { x.cfg.Metrics.observeReconcile(time.Since(began)) }()
	var invoiced int64
	if err := tx.QueryRow(ctx, sqlReconcile, x.period.String(), x.cut.start, x.cut.end, x.cut.at).
		Scan(&rec.population, &rec.missing, &invoiced, &rec.unbilled); err != nil {
		return rec, err
	}
	left := rec.missing
	if rec.missing > 0 {
		var (
			fenced       bool
			firsts, last []int64
		)
		err := tx.QueryRow(ctx, sqlRepair, x.period.String(), x.fence, int64(math.MinInt64), int64(math.MaxInt64), maxRepairRanges,
			x.cut.start, x.cut.end, x.cut.at, x.cut.zone, x.period.Days()).
			Scan(&fenced, &rec.repaired, &rec.ranges, &firsts, &last)
		switch {
		case err != nil && postgres.IsTransient(err):
			return rec, err
		case err != nil:
			return rec, &UnreconciledError{Period: x.period, Err: err}
		case !fenced: // unreachable: the transaction holds the row
			return rec, errNotOurs
		}
		for i := range firsts {
			rec.shown = append(rec.shown, [2]int64{firsts[i], last[i]})
		}
		if err := tx.QueryRow(ctx, sqlReconcile, x.period.String(), x.cut.start, x.cut.end, x.cut.at).
			Scan(&rec.population, &left, &invoiced, &rec.unbilled); err != nil {
			return rec, err
		}
		if left > 0 {
			return rec, &UnreconciledError{Period: x.period, Missing: left}
		}
	}
	// "Exactly the population" also means no invoice beyond it; those are
	// reported, not deleted (an invoice is evidence).
	if rec.outside = invoiced - (rec.population - left); rec.outside > 0 {
		if err := tx.QueryRow(ctx, sqlOutsidePopulation, x.period.String(), x.cut.start, x.cut.end, x.cut.at, maxOutsideIDs).
			Scan(&rec.outsideIDs); err != nil {
			return rec, err
		}
	}
	rec.took = time.Since(began)
	return rec, nil
}

// finishTotals is what sqlFinish returns.
type finishTotals struct {
	periodBatches, periodSubs, periodCreated, periodAlready int64
	batches, subs, created, already                         int64
}

func (t *finishTotals) dest() []any {
	return []any{&t.periodBatches, &t.periodSubs, &t.periodCreated, &t.periodAlready,
		&t.batches, &t.subs, &t.created, &t.already}
}

// counts are the run's counts from the database: the period's totals
// (every claim's batches, and the repair), and this claim's batches (the
// repair, which only the completing claim makes, is added by
// completeOnce).
func (t finishTotals) counts() map[string]int64 {
	return map[string]int64{
		CountPeriodBatches:         t.periodBatches,
		CountPeriodSubscribers:     t.periodSubs,
		CountPeriodInvoicesCreated: t.periodCreated,
		CountPeriodAlreadyInvoiced: t.periodAlready,
		CountBatchesCommitted:      t.batches,
		CountBatchesSkipped:        t.periodBatches - t.batches,
		CountBatchesTotal:          t.periodBatches,
		CountSubscribers:           t.subs,
		CountInvoicesCreated:       t.created,
		CountAlreadyInvoiced:       t.already,
	}
}

// into puts the database's counts into counts, for a run that did not
// complete: its recorded batches and the period's totals. batches_total
// stays the run's plan (skipped + planned), which the database does not
// hold.
func (t finishTotals) into(counts map[string]int64) {
	for k, v := range t.counts() {
		if k != CountBatchesTotal {
			counts[k] = v
		}
	}
}
