package billrun

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

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
func (x *execution) runBatchRetrying(ctx context.Context, b batchRange, st *runState) (err error) {
	cfg := x.cfg
	ctx, span := x.batchSpan(ctx, b)
	attempt := 1
	defer func() { endBatchSpan(span, attempt, err) }()
	for ; ; attempt++ {
		out, err := x.runBatch(ctx, b, st, attempt > 1)
		if err == nil {
			st.committedBatch(out, cfg.ConflictSample)
			cfg.Metrics.committed(out.created, out.subscribers-out.created)
			x.run.Committed(1, out.subscribers)
			if span.IsRecording() {
				span.SetAttributes(attribute.Int64("billrun.subscribers", out.subscribers),
					attribute.Int64("billrun.invoices_created", out.created))
			}
			return nil
		}
		if span.IsRecording() {
			span.AddEvent("billrun.batch_attempt_failed", trace.WithAttributes(attribute.Int("billrun.attempt", attempt),
				attribute.String("error", err.Error())))
		}
		if ctx.Err() != nil {
			return nil // lost or shutdown: the batch rolled back, or committed under the fence unseen (the status sums bill_run_batches)
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
			"delay_ms", delay.Milliseconds(), "error", err)
		if !sleep(ctx, delay) {
			return nil
		}
	}
}

// batchSpan is one batch's span, billrun.batch (its SQL nests under it);
// no cost with tracing off.
func (x *execution) batchSpan(ctx context.Context, b batchRange) (context.Context, trace.Span) {
	if !x.run.Tracing() {
		return ctx, trace.SpanFromContext(context.Background())
	}
	return x.run.StartSpan(ctx, "billrun.batch", attribute.String("billrun.period", x.period.String()),
		attribute.Int64("billrun.first_id", b.first), attribute.Int64("billrun.last_id", b.last),
		attribute.Int64("billrun.planned", b.n))
}

func endBatchSpan(span trace.Span, attempts int, err error) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.Int("billrun.attempts", attempts))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

type batchOut struct {
	subscribers, created int64
	sample               []int64
}

// runBatch is one batch in one round trip: sqlBatch proves the fence,
// inserts the invoices and records the batch, in one statement and so in
// one implicit transaction. On a retry it first looks for the batch's own
// record: a batch whose commit was lost from sight (the connection broke
// after the server committed) must count once, not fail on its own record.
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
	conn, err := x.pool.Acquire(ctx)
	if err != nil {
		return out, err
	}
	defer conn.Release()
	t = phase(PhaseAcquire, t)

	if retry {
		err := conn.QueryRow(ctx, sqlCommittedBatch, period, b.first, x.fence).Scan(&out.subscribers, &out.created)
		if err == nil {
			x.log.Info("billrun_batch_found_committed", "first_id", b.first, "last_id", b.last)
			return out, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return out, err
		}
		t = phase(PhaseVerify, t)
	}

	var fenced bool
	if err := conn.QueryRow(ctx, sqlBatch, period, x.fence, b.first, b.last, cfg.ConflictSample,
		x.cut.start, x.cut.end, x.cut.at, x.cut.zone, x.period.Days(), x.run.Replica()).
		Scan(&fenced, &out.subscribers, &out.created, &out.sample); err != nil {
		// The range's record exists under our fence: an earlier try of this
		// batch was still running when this one was sent and has committed
		// since (the key check waited for it). Count it once, not as an
		// escaped unique violation.
		if postgres.ConstraintName(err) == "bill_run_batches_pkey" {
			var found batchOut
			if e := conn.QueryRow(ctx, sqlCommittedBatch, period, b.first, x.fence).Scan(&found.subscribers, &found.created); e == nil {
				x.log.Info("billrun_batch_found_committed", "first_id", b.first, "last_id", b.last)
				return found, nil
			}
		}
		return batchOut{}, err
	}
	phase(PhaseStatement, t)
	if !fenced {
		return batchOut{}, errFenceLost
	}
	return out, nil
}
