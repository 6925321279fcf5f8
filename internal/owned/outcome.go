package owned

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// How a run ends: its outcome, last event, release, request for the
// resumer, metrics (the run: run_owned.go).

// settle maps what the work returned to an outcome, emits the run's last
// event and releases the lock.
func (o *Owned) settle(ctx context.Context, rep Report, err, cause error) job.Outcome {
	o.res.Counts = rep.Counts
	outcome, reason := o.classify(err, cause)
	data := countsData(rep.Counts, rep.Data)
	switch outcome {
	case job.OutcomeCompleted:
		if w := o.worker; w.records != nil && w.records(o.params) {
			// At least once: the id the Worker stored with the completion,
			// and the store marks it published only once the sink
			// acknowledged that event; the resumers re-publish it otherwise
			// (Worker.Completions).
			o.run.sendAcked(ctx, events.RunCompleted, o.run.fence, "", data, o.run.completionID,
				o.r.markPublished(w, o.params, o.run.fence, o.run.log))
		} else {
			o.run.send(ctx, events.RunCompleted, o.run.fence, "", data)
		}
	case job.OutcomeLost:
		o.res.Error = "ownership lost: " + reason
		if err != nil && !errors.Is(err, ErrLost) {
			o.res.Error += ": " + err.Error()
		} else if err != nil {
			o.res.Error = err.Error()
		}
		data["reason"] = reason
		o.lostSent = true
		o.run.send(ctx, events.OwnershipLost, o.run.fence, "", data)
	default:
		o.res.Error = err.Error()
		o.res.Retryable = IsRetryable(err)
		o.badInput = errors.Is(err, job.ErrBadInput)
		data["error"] = o.res.Error
		data["retryable"] = o.res.Retryable
		o.run.send(ctx, events.RunFailed, o.run.fence, "", data)
	}
	o.release(ctx)
	return outcome
}

// markPublished returns the callback of a tracked run.completed's
// acknowledgement: it records the completion published in the kind's store,
// in a goroutine of its own (the callback runs on the sink's producer) under
// requestTimeout. A mark that fails leaves the completion to the resumers,
// which re-publish it with the same id.
func (r *Runner) markPublished(w *worker, p Params, fence int64, log *slog.Logger) func() {
	return func() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
			defer cancel()
			if err := w.published(ctx, p, fence); err != nil {
				log.Warn("run_completed_mark_failed", "fence", fence, "error", err,
					"detail", "the resumers will publish run.completed again, with the same id")
			}
		}()
	}
}

// classify: nil is completed; a *LostError, an error caused by the lease
// ending, or any error once the work's context was cancelled is lost (the
// safe side: a lost trigger is redelivered, a failed one is committed);
// the rest is failed.
func (o *Owned) classify(err, cause error) (job.Outcome, string) {
	var le *LostError
	switch {
	case err == nil:
		return job.OutcomeCompleted, ""
	case errors.As(err, &le):
		return job.OutcomeLost, le.Reason
	case errors.Is(o.held.Err(), ownership.ErrLeaseLost), errors.Is(err, ownership.ErrLeaseLost):
		return job.OutcomeLost, ReasonLeaseLost
	case errors.Is(cause, ErrShutdown):
		return job.OutcomeLost, ReasonShutdown
	case cause != nil:
		return job.OutcomeLost, ReasonLeaseLost
	}
	return job.OutcomeFailed, ""
}

// release gives the lock back unless it is already gone. Before the
// minimum hold has passed, the release is deferred to acquired + MinHold
// (ownership.released says so at once); otherwise it happens now, under a
// bounded context that outlives a cancelled ctx. TTL expiry is the backstop.
func (o *Owned) release(ctx context.Context) {
	held, log := o.held, o.run.log
	if err := held.Err(); err != nil { // lost or run out: nothing of ours is left
		if errors.Is(err, ownership.ErrLeaseLost) {
			o.lostAfterRun(ctx, ReasonLeaseLost)
		}
		return
	}
	if hold := o.lease.MinHold; hold > 0 {
		if remaining := hold - time.Since(o.run.acquired); remaining > 0 {
			log.Info("run_release_deferred", "min_hold_ms", hold.Milliseconds(), "release_in_ms", remaining.Milliseconds())
			o.run.send(ctx, events.OwnershipReleased, o.run.fence, "", map[string]any{"release": "after_min_hold",
				"release_in_ms": remaining.Milliseconds(), "min_hold_ms": hold.Milliseconds()})
			o.r.holds.defer_(remaining, held, log)
			return
		}
	}
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownership.ReleaseTimeout)
	defer cancel()
	relCtx, span := o.run.child(relCtx, "lock.release", AttrLockKey.String(o.run.key))
	err := held.Release(relCtx)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	if err != nil {
		if errors.Is(err, ownership.ErrNotHeld) {
			o.lostAfterRun(ctx, ReasonLeaseLost)
			return
		}
		log.Warn("run_release_failed", "error", err)
		o.lostAfterRun(ctx, ReasonReleaseFailed)
		return
	}
	o.run.send(ctx, events.OwnershipReleased, o.run.fence, "", map[string]any{"release": "delete"})
}

// lostAfterRun ends the term in the event stream when the release could not:
// the lease had ended already (a run that completed under its Postgres fence
// after the lock was lost), or the delete did not reach the backend (the lock
// expires with its TTL). Every ownership.acquired is followed by a released
// or a lost; a lost the run's own outcome already sent is not repeated.
func (o *Owned) lostAfterRun(ctx context.Context, reason string) {
	if o.lostSent {
		return
	}
	o.lostSent = true
	o.run.send(ctx, events.OwnershipLost, o.run.fence, "", map[string]any{"reason": reason, "after_run": true})
}

// end fixes the outcome, records what it means for the run's request (a
// resumable kind), records metrics and tells the kind's Observe.
func (o *Owned) end(outcome job.Outcome) job.Result {
	o.res.Outcome = outcome
	o.res.BadInput = outcome == job.OutcomeFailed && o.badInput
	o.settleRequest()
	took := time.Since(o.start)
	o.res.DurationMS = took.Milliseconds()
	o.r.m.ended(o.run.job, outcome, took)
	o.recordHistory()
	if o.worker != nil && o.worker.observe != nil {
		o.worker.observe(o.res)
	}
	if outcome != job.OutcomeAlreadyOwned && outcome != job.OutcomeUnavailable {
		level := slog.LevelInfo
		if outcome == job.OutcomeFailed || outcome == job.OutcomeLost {
			level = slog.LevelWarn
		}
		o.run.log.Log(context.Background(), level, "run_ended", "outcome", string(outcome),
			"duration_ms", o.res.DurationMS, "error", o.res.Error)
	}
	o.run.endTrace(o.res)
	return o.res
}

// settleRequest records, for a resumable kind (Worker.Incomplete), what the run's end means for
// its request (run_requests), before the Result reaches the transport (a
// Kafka trigger is committed after this):
//
//   - completed, already_completed: the request is forgotten.
//   - failed permanently: recorded permanent (it pages; nobody retries).
//   - lost, a retryable failure, already_owned (the holder may still die),
//     unavailable from cron: recorded for the resumer, and the Result is
//     Deferred. Unavailable from any other source is not: Kafka retries the
//     record in place, HTTP answered 503, the CLI exited 69.
//   - a run of the resumer itself: the resumer books its own attempts.
//   - failed on the caller's input (job.ErrBadInput, e.g. an adjustment of
//     a period whose bill run is not COMPLETED): nothing is recorded; the
//     caller was told, and the key's pending request (the bill run's own)
//     must not be overwritten by one that can never run.
//
// A write that fails leaves the Result not Deferred, so a Kafka trigger is
// retried rather than committed.
func (o *Owned) settleRequest() {
	if !o.res.Resumable || o.r.requests == nil {
		return
	}
	src := o.run.trigger.Source
	out := o.res.Outcome
	var permanent bool
	switch {
	case out == job.OutcomeFailed && o.badInput:
		return
	case out == job.OutcomeCompleted, out == job.OutcomeAlreadyCompleted:
	case out == job.OutcomeFailed && !o.res.Retryable:
		permanent = true
	case src == job.SourceResume:
		return
	case out == job.OutcomeUnavailable && src != job.SourceCron:
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	var err error
	if out == job.OutcomeCompleted || out == job.OutcomeAlreadyCompleted {
		err = o.r.requests.done(ctx, o.run.job, o.run.key)
	} else {
		var q request
		if q, err = encodeRequest(o.kind, o.params, o.run.trigger); err == nil {
			err = o.r.requests.record(ctx, q, out, permanent, o.res.Error)
		}
		o.res.Deferred = err == nil && !permanent
	}
	if err != nil {
		o.run.log.Warn("run_request_record_failed", "outcome", string(out), "error", err)
		return
	}
	if o.res.Deferred {
		o.run.log.Info("run_request_deferred", "outcome", string(out), "detail", "recorded for the resumer")
	}
}

// refusedSpan ends an acquire span that got no lock: already owned is an
// answer, not an error; unavailable is.
func refusedSpan(span trace.Span, err error) {
	var ae *ownership.AcquireError
	if errors.Is(err, ownership.ErrAlreadyOwned) {
		span.SetAttributes(attribute.String("coordinator.lock_reason", string(ownership.ReasonAlreadyOwned)))
		if errors.As(err, &ae) && ae.Owner != "" {
			span.SetAttributes(AttrOwner.String(ae.Owner))
		}
	} else {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// claimRefusal names why a claim was not taken, for its span.
func claimRefusal(err error) string {
	switch {
	case errors.Is(err, ErrAlreadyCompleted):
		return "already_completed"
	case errors.Is(err, ErrLost):
		return "lost"
	}
	return "failed"
}

func countsData(counts map[string]int64, data map[string]any) map[string]any {
	out := make(map[string]any, len(counts)+len(data)+2)
	for k, v := range counts {
		out[k] = v
	}
	for k, v := range data {
		out[k] = v
	}
	return out
}

// holds are the locks kept after their runs for a minimum hold, each to be
// released by its timer, or at once by Runner.Close.
type holds struct {
	mu     sync.Mutex
	next   int
	timers map[int]*time.Timer
	leases map[int]func()
}

// defer_ releases held after d, or when the Runner closes, whichever comes
// first.
func (h *holds) defer_(d time.Duration, held ownership.Lease, log *slog.Logger) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.timers == nil {
		h.timers, h.leases = map[int]*time.Timer{}, map[int]func(){}
	}
	id := h.next
	h.next++
	var once sync.Once
	release := func() {
		once.Do(func() {
			relCtx, cancel := context.WithTimeout(context.Background(), ownership.ReleaseTimeout)
			defer cancel()
			if err := held.Release(relCtx); err != nil && !errors.Is(err, ownership.ErrNotHeld) {
				log.Warn("run_release_failed", "error", err)
			}
		})
	}
	h.leases[id] = release
	h.timers[id] = time.AfterFunc(d, func() {
		h.mu.Lock()
		delete(h.timers, id)
		delete(h.leases, id)
		h.mu.Unlock()
		release()
	})
}

// releaseAll releases every lock still kept for its minimum hold, now.
func (h *holds) releaseAll() {
	h.mu.Lock()
	var now []func()
	for id, t := range h.timers {
		if t.Stop() {
			now = append(now, h.leases[id])
		}
		delete(h.timers, id)
		delete(h.leases, id)
	}
	h.mu.Unlock()
	for _, release := range now {
		release()
	}
}
