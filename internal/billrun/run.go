package billrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// Counts keys of a bill run's Result. A run that reaches its bill_runs row
// (COMPLETED, FAILED, INTERRUPTED) reports them as the database has them
// (sqlFinish), not as the run counted them; batches_retried and
// unique_violations count attempts that rolled back, so they are the run's.
const (
	CountSubscribers      = "subscribers"       // population subscribers this run billed or found billed: its batches' and its repair's
	CountInvoicesCreated  = "invoices_created"  // invoices this run inserted (its batches' and its repair's)
	CountAlreadyInvoiced  = "already_invoiced"  // subscribers this run's batches found already invoiced for the period
	CountBatchesTotal     = "batches_total"     // COMPLETED: the period's recorded batches; otherwise skipped + planned by this run
	CountBatchesSkipped   = "batches_skipped"   // committed by earlier runs of the period (resume)
	CountBatchesCommitted = "batches_committed" // committed by this run and recorded
	CountBatchesRetried   = "batches_retried"   // batch tries that failed and were tried again
	CountUniqueViolations = "unique_violations" // 23505 errors that escaped ON CONFLICT
	// CountRepaired: subscribers of the population the completion found
	// without an invoice, after every batch had committed, and billed
	// (complete.go). Non-zero means commits were lost or rows changed
	// behind the run: it alerts as CoordinatorBillRunRepaired.
	CountRepaired = "repaired"
	// CountPopulation: the period's population at the cutoff, counted by the
	// completion's reconcile; every one of them has an invoice.
	CountPopulation = "population"
	// CountOutsidePopulation: the period's invoices, at the completion, of
	// subscribers outside its population at the cutoff (changed out of it
	// after their batch, deleted, or invoiced by another writer). Reported,
	// never deleted.
	CountOutsidePopulation = "outside_population"
	// Period totals over every run of the period, read from bill_runs at the end.
	CountPeriodBatches         = "period_batches"
	CountPeriodSubscribers     = "period_subscribers"
	CountPeriodInvoicesCreated = "period_invoices_created"
	CountPeriodAlreadyInvoiced = "period_already_invoiced"
)

// DataEmptyPopulation is run.completed's empty_population: true when the
// period had no billable subscriber at the cutoff.
const DataEmptyPopulation = "empty_population"

// Lost reasons, in the data of ownership.lost.
const (
	ReasonLeaseLost = owned.ReasonLeaseLost // the Redis lease ended (renewal failed or found the lock gone)
	ReasonFenceLost = "fence_lost"          // a newer claim took the bill_runs row
	ReasonShutdown  = owned.ReasonShutdown  // the run's caller shut down
)

// finishTimeout bounds ending a run that did not complete (marking it
// FAILED or INTERRUPTED), retries included; completeTimeout bounds a
// completion.
const finishTimeout = 15 * time.Second

// execution is one claimed run of a period.
type execution struct {
	retrier
	pool   *pgxpool.Pool
	period Period
	fence  int64
	run    *owned.Run
	cut    cutoff
}

// cutoff is the population a run bills, as its first claim fixed it.
type cutoff struct {
	start, end time.Time // the period's instants in the zone
	zone       string    // the billing zone's name
	at         time.Time // the first claim's time: later subscribers are not in the run
}

// loadCutoff reads the claim's cutoff.
func (x *execution) loadCutoff(ctx context.Context) error {
	var c cutoff
	var start, end, at *time.Time
	var zone *string
	err := x.pool.QueryRow(ctx, sqlCutoff, x.period.String(), x.fence).Scan(&start, &end, &zone, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return errFenceLost
	}
	if err != nil {
		return err
	}
	if start == nil || end == nil || zone == nil || at == nil {
		return fmt.Errorf("billrun: bill_runs %s has no population cutoff (claimed by an older version?)", x.period)
	}
	c.start, c.end, c.zone, c.at = *start, *end, *zone, *at
	x.cut = c
	return nil
}

// runState aggregates a run's progress across workers.
type runState struct {
	mu               sync.Mutex
	committed        int64
	planned          int64
	retried          int64
	subscribers      int64
	created          int64
	already          int64
	uniqueViolations int64
	sample           []int64
	phase            map[string]time.Duration
}

func (s *runState) addPhase(name string, d time.Duration) {
	s.mu.Lock()
	s.phase[name] += d
	s.mu.Unlock()
}

func (s *runState) committedBatch(out batchOut, sampleSize int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.committed++
	s.subscribers += out.subscribers
	s.created += out.created
	s.already += out.subscribers - out.created
	if room := sampleSize - len(s.sample); room > 0 {
		s.sample = append(s.sample, out.sample[:min(room, len(out.sample))]...)
	}
}

// Run bills the claimed period: plan, run the batches, end the bill_runs
// row under the fence. ctx cancelled (shutdown) or the lease lost: no new
// batch starts, in-flight ones roll back, the row is marked INTERRUPTED
// while the fence is still ours, and the error is lost. A batch that keeps
// failing: the row is FAILED with last_error and the error says why.
// Otherwise COMPLETED, and the counts carry the period's totals.
func (w *Worker) Run(ctx context.Context, run *owned.Run, req Request) (owned.Report, error) {
	if req.Adjust {
		return w.runAdjust(ctx, run, req.Period)
	}
	x := &execution{retrier: retrier{cfg: w.cfg, log: run.Log()}, pool: w.pool, period: req.Period, fence: run.Fence(), run: run}
	w.cfg.Metrics.running(1)
	defer w.cfg.Metrics.running(-1)

	if sabotaged { // chaos_sabotage builds only (sabotage.go): go on after the lease is lost
		ctx = context.WithoutCancel(ctx)
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	st := &runState{phase: map[string]time.Duration{}}
	var ranges []batchRange
	err := x.retry(runCtx, "load_committed", func(ctx context.Context) error {
		if err := x.loadCutoff(ctx); err != nil {
			return err
		}
		var err error
		ranges, err = x.committedRanges(ctx)
		return err
	})
	if err != nil && runCtx.Err() == nil {
		cancel(err)
	}

	var (
		wg      sync.WaitGroup
		planned atomic.Bool // the planner walked the whole population
	)
	if runCtx.Err() == nil {
		run.Resumed(int64(len(ranges)))
		tot := x.startTotal(runCtx, &wg, int64(len(ranges)), st)
		batches := make(chan batchRange, x.cfg.Workers)
		wg.Go(func() {
			defer close(batches)
			err := x.plan(runCtx, ranges, batches, st)
			planned.Store(err == nil)
			if err == nil {
				tot.exact(runCtx)
			}
			if err != nil && runCtx.Err() == nil {
				cancel(fmt.Errorf("billrun: plan batches: %w", err))
			}
		})
		for range x.cfg.Workers {
			wg.Go(func() { x.work(runCtx, cancel, batches, st) })
		}
		wg.Wait()
	}

	skipped := int64(len(ranges))
	st.mu.Lock()
	// The run's own view, for a run that cannot end its row (Postgres
	// unreachable): every run that reaches its row reports the database's
	// counts instead (end).
	counts := map[string]int64{
		CountSubscribers:      st.subscribers,
		CountInvoicesCreated:  st.created,
		CountAlreadyInvoiced:  st.already,
		CountBatchesTotal:     skipped + st.planned,
		CountBatchesSkipped:   skipped,
		CountBatchesCommitted: st.committed,
		CountBatchesRetried:   st.retried,
		CountUniqueViolations: st.uniqueViolations,
	}
	// Every planned batch committed under our fence: the work is done, even
	// if the lease ended or shutdown began after the last commit (Postgres,
	// not the lease, proved each commit; the completion is fenced too).
	allDone := planned.Load() && st.committed == st.planned
	sample := append([]int64(nil), st.sample...)
	phases := make([]any, 0, 2*len(st.phase))
	for k, v := range st.phase {
		phases = append(phases, k+"_ms", v.Milliseconds())
	}
	st.mu.Unlock()
	x.cfg.Metrics.batch("skipped", int(skipped))

	runErr := x.verdict(allDone, context.Cause(runCtx))
	if counts[CountAlreadyInvoiced] > 0 {
		run.Emit(ctx, events.BillrunInvoiceConflict, map[string]any{
			CountAlreadyInvoiced: counts[CountAlreadyInvoiced],
			"sample":             sample,
		})
	}
	rep := owned.Report{Counts: counts}
	runErr = transient(x.end(ctx, runErr, &rep, skipped+counts[CountBatchesCommitted]))

	logArgs := append([]any{"error", runErr, "batches_committed", rep.Counts[CountBatchesCommitted], "batches_skipped", rep.Counts[CountBatchesSkipped],
		"invoices_created", rep.Counts[CountInvoicesCreated], "already_invoiced", rep.Counts[CountAlreadyInvoiced]}, phases...)
	level := slog.LevelInfo
	if runErr != nil {
		level = slog.LevelWarn
	}
	x.log.Log(ctx, level, "billrun_batches_done", logArgs...)
	return rep, runErr
}

// verdict says how the batches ended: nil (all committed), a lost error
// with its reason, or the error that failed the run.
func (x *execution) verdict(allDone bool, cause error) error {
	switch {
	case allDone:
		return nil
	case cause == nil: // unreachable: workers stop early only after a cancel
		return errors.New("billrun: batches left undone")
	case errors.Is(x.run.Lease().Err(), ownership.ErrLeaseLost):
		return owned.Lost(ReasonLeaseLost, nil)
	case errors.Is(cause, errFenceLost):
		return owned.Lost(ReasonFenceLost, nil)
	case errors.Is(cause, owned.ErrShutdown):
		return owned.Lost(ReasonShutdown, nil)
	}
	return cause
}

// end marks the bill_runs row under the fence: COMPLETED once the
// completion transaction reconciled the period (complete.go), INTERRUPTED
// for a lost run, FAILED with last_error. rep's counts become the
// database's wherever the row could be ended (the attempts that failed,
// batches_retried and unique_violations, rolled back and stay the run's
// own). It needs Postgres even when ctx is gone. It returns the run's
// final error: a COMPLETED that finds the fence superseded is lost; a
// reconcile that cannot close a gap is a retryable failure.
func (x *execution) end(ctx context.Context, runErr error, rep *owned.Report, planned int64) error {
	var lost *owned.LostError
	switch {
	case runErr == nil:
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), completeTimeout)
		counts, rec, ok, err := x.complete(cctx, planned)
		cancel()
		var unrec *UnreconciledError
		switch {
		case errors.As(err, &unrec):
			x.cfg.Metrics.reconcileFailed()
			x.log.Error("billrun_unreconciled", "error", err, "population", rec.population, "missing", rec.missing,
				"still_missing", unrec.Missing, "detail", "not COMPLETED: the resumer retries the run; see docs/runbook.md#coordinatorbillrununreconciled")
			// Retryable whatever the repair's error: the period is not
			// billed, and the resumer tries again (with backoff, up to its
			// attempts) while it pages.
			runErr = owned.Retryable(err)
		case err != nil:
			runErr = fmt.Errorf("billrun: mark COMPLETED: %w", err)
		case !ok:
			return owned.Lost(ReasonFenceLost, nil)
		default:
			x.completed(rep, counts, rec)
			return nil
		}
	case errors.As(runErr, &lost):
		msg := "interrupted: " + lost.Reason
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
		defer cancel()
		if totals, ok, err := x.finish(ectx, StatusInterrupted, &msg); err != nil {
			x.log.Warn("billrun_mark_interrupted_failed", "error", err)
		} else if ok {
			totals.into(rep.Counts)
		}
		return runErr
	}
	msg := runErr.Error()
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	totals, ok, err := x.finish(ectx, StatusFailed, &msg)
	if err != nil || !ok {
		x.log.Warn("billrun_mark_failed_failed", "error", err, "fence_ours", ok)
	} else {
		totals.into(rep.Counts)
	}
	return runErr
}

// completed takes a COMPLETED run's counts from the database into rep,
// with its attempt counts, says whether its population was empty, and
// reports a repair.
func (x *execution) completed(rep *owned.Report, counts map[string]int64, rec reconciliation) {
	counts[CountBatchesRetried] = rep.Counts[CountBatchesRetried]
	counts[CountUniqueViolations] = rep.Counts[CountUniqueViolations]
	rep.Counts = counts
	empty := !reconcileSkipped && rec.population == 0
	rep.Data = map[string]any{DataEmptyPopulation: empty}
	m := x.cfg.Metrics
	m.repaired(rec.repaired)
	if empty {
		m.emptyPopulation()
		x.log.Warn("billrun_empty_population", "period", x.period.String(), "cutoff_at", x.cut.at,
			"detail", "no subscriber is billable for the period at the cutoff; subscribers loaded or backdated into it later are billed by an adjustment run (--adjust)")
	}
	if rec.repaired > 0 {
		ranges := make([]string, len(rec.shown))
		for i, r := range rec.shown {
			ranges[i] = fmt.Sprintf("%d-%d", r[0], r[1])
		}
		x.log.Warn("billrun_repaired", "period", x.period.String(), CountRepaired, rec.repaired, "missing", rec.missing,
			CountPopulation, rec.population, "ranges", rec.ranges, "first_ranges", ranges,
			"detail", "subscribers of the population had no invoice after every batch committed (lost commits?): billed under the run's fence; see docs/runbook.md#coordinatorbillrunrepaired")
	}
	if rec.outside > 0 {
		x.log.Warn("billrun_outside_population", "period", x.period.String(), CountOutsidePopulation, rec.outside, "sample", rec.outsideIDs,
			"detail", "the period has invoices of subscribers outside its population at the cutoff (changed out of it after their batch, deleted, or invoiced by another writer): nothing was deleted; see docs/contract.md#what-completed-proves")
	}
	x.log.Info("billrun_reconciled", CountPopulation, rec.population, CountRepaired, rec.repaired, CountOutsidePopulation, rec.outside,
		"duration_ms", rec.took.Milliseconds())
}

// finish ends the run under the fence with a status other than COMPLETED
// (that is complete's). ok false: the fence is no longer ours. Transient
// errors are retried until ctx ends: the row's status is worth waiting for
// (a Postgres restart), and ctx bounds the wait.
func (x *execution) finish(ctx context.Context, status string, lastError *string) (finishTotals, bool, error) {
	var t finishTotals
	ok := true
	err := x.retryUntil(ctx, "finish", func(ctx context.Context) error {
		err := x.pool.QueryRow(ctx, sqlFinish, x.period.String(), x.fence, status, lastError, x.run.CompletionEventID(),
			int64(0), nil).Scan(t.dest()...)
		if errors.Is(err, pgx.ErrNoRows) {
			ok = false
			return nil
		}
		return err
	})
	if err != nil {
		return t, false, err
	}
	return t, ok, nil
}
