package billrun

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/postgres"
)

// errFenceLost: a batch found the claim fence no longer ours.
var errFenceLost = errors.New("billrun: claim fence superseded")

// batchError is a batch that could not commit: the run fails.
type batchError struct {
	first, last int64
	attempts    int
	err         error
}

func (e *batchError) Error() string {
	msg := fmt.Sprintf("batch [%d,%d] failed after %d attempt(s)", e.first, e.last, e.attempts)
	if postgres.IsUniqueViolation(e.err) {
		msg += fmt.Sprintf(": unique violation (SQLSTATE 23505) on %s", cmp.Or(postgres.ConstraintName(e.err), "unknown constraint"))
	}
	return msg + ": " + e.err.Error()
}

func (e *batchError) Unwrap() error { return e.err }

// work runs batches until the channel closes or the run is cancelled.
func (x *execution) work(ctx context.Context, cancel context.CancelCauseFunc, in <-chan batchRange, st *runState) {
	for b := range in {
		if ctx.Err() != nil {
			return
		}
		if hook := x.cfg.beforeBatch; hook != nil {
			if err := hook(ctx, b.first, b.last); err != nil {
				if ctx.Err() == nil {
					cancel(fmt.Errorf("billrun: before batch [%d,%d]: %w", b.first, b.last, err))
				}
				return
			}
			if ctx.Err() != nil {
				return
			}
		}
		if err := x.runBatchRetrying(ctx, b, st); err != nil {
			if ctx.Err() == nil {
				cancel(err)
			}
			return
		}
	}
}

// runBatchRetrying runs one batch, trying again after transient errors and
// escaped unique violations up to MaxBatchAttempts. It returns errFenceLost,
// a *batchError, or nil (committed, or the run was cancelled meanwhile).
func (x *execution) runBatchRetrying(ctx context.Context, b batchRange, st *runState) error {
	cfg := x.cfg
	for attempt := 1; ; attempt++ {
		out, err := x.runBatch(ctx, b, st, attempt > 1)
		if err == nil {
			st.committedBatch(out, cfg.ConflictSample)
			cfg.Metrics.committed(out.created, out.subscribers-out.created)
			return nil
		}
		if ctx.Err() != nil {
			return nil // lost or shutdown: the transaction rolled back
		}
		if errors.Is(err, errFenceLost) {
			cfg.Metrics.batch("fence_lost", 1)
			x.log.Warn("billrun_fence_lost", "first_id", b.first, "last_id", b.last)
			return errFenceLost
		}
		unique := postgres.IsUniqueViolation(err)
		if unique {
			// Never silent, never generic: an invoice conflict, by its code.
			st.mu.Lock()
			st.uniqueViolations++
			st.mu.Unlock()
			cfg.Metrics.uniqueViolation()
			x.run.Emit(ctx, events.BillrunInvoiceConflict, map[string]any{
				"sqlstate": postgres.CodeUniqueViolation, "constraint": postgres.ConstraintName(err),
				"first_id": b.first, "last_id": b.last, "attempt": attempt, "error": err.Error(),
			})
			x.log.Warn("billrun_unique_violation", "first_id", b.first, "last_id", b.last,
				"constraint", postgres.ConstraintName(err), "attempt", attempt)
		}
		if !unique && !postgres.IsTransient(err) || attempt >= cfg.MaxBatchAttempts {
			cfg.Metrics.batch("failed", 1)
			return &batchError{first: b.first, last: b.last, attempts: attempt, err: err}
		}
		st.mu.Lock()
		st.retried++
		st.mu.Unlock()
		cfg.Metrics.batch("retried", 1)
		delay := backoff(cfg.RetryBackoff, attempt)
		x.log.Warn("billrun_batch_retry", "first_id", b.first, "last_id", b.last, "attempt", attempt,
			"delay_ms", delay.Milliseconds(), "err", err)
		if !sleep(ctx, delay) {
			return nil
		}
	}
}

type batchOut struct {
	subscribers, created int64
	sample               []int64
}

// runBatch is one batch transaction: prove the fence, insert the invoices,
// record the batch, commit. On a retry it first looks for the batch's own
// record: a COMMIT whose answer was lost (the connection broke after the
// server committed) must count once, not fail on its own record.
func (x *execution) runBatch(ctx context.Context, b batchRange, st *runState, retry bool) (batchOut, error) {
	var out batchOut
	cfg := x.cfg
	period := x.period.String()
	phase := func(name string, since time.Time) time.Time {
		now := time.Now()
		d := now.Sub(since)
		cfg.Metrics.observePhase(name, d)
		st.addPhase(name, d)
		return now
	}
	t := time.Now()
	tx, err := x.pool.Begin(ctx)
	if err != nil {
		return out, err
	}
	defer func() {
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rbCtx) // no-op after Commit
	}()
	t = phase(PhaseBegin, t)

	var fence int64
	var idle string
	err = tx.QueryRow(ctx, batchFenceSQL, period, x.fence, cfg.IdleInTransactionTimeout.String()).Scan(&fence, &idle)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, errFenceLost
	}
	if err != nil {
		return out, err
	}
	t = phase(PhaseFenceCheck, t)

	if retry {
		err := tx.QueryRow(ctx, sqlCommittedBatch, period, b.first, x.fence).Scan(&out.subscribers, &out.created)
		if err == nil {
			x.log.Info("billrun_batch_found_committed", "first_id", b.first, "last_id", b.last)
			return out, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return out, err
		}
	}

	if err := tx.QueryRow(ctx, sqlInsertInvoices, period, x.fence, b.first, b.last, cfg.ConflictSample).
		Scan(&out.subscribers, &out.created, &out.sample); err != nil {
		return out, err
	}
	t = phase(PhaseInsert, t)

	if _, err := tx.Exec(ctx, sqlRecordBatch, period, b.first, b.last, x.fence, x.run.Replica(),
		out.subscribers, out.created, out.subscribers-out.created); err != nil {
		return out, err
	}
	t = phase(PhaseRecord, t)

	if err := tx.Commit(ctx); err != nil {
		return out, err
	}
	phase(PhaseCommit, t)
	return out, nil
}
