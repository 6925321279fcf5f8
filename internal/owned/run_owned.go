package owned

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// A run through the template: Begin takes the lock and the claim, Execute
// runs the kind's work under the lease (runner.go; its end: outcome.go).

// Owned is a run whose lock is held (and whose claim is taken). Call
// Execute exactly once.
type Owned struct {
	r      *Runner
	kind   Kind
	worker *worker
	params Params
	run    *Run
	lease  Lease
	held   ownership.Lease
	start  time.Time
	res    job.Result

	executed atomic.Bool
	lostSent bool // an ownership.lost ended the term in the event stream
	badInput bool // failed on the caller's input (job.ErrBadInput): nothing to resume
}

// Fence is the claim's fence (Worker.Claim), else the lock's.
func (o *Owned) Fence() int64 { return o.run.fence }

// Begin takes the lock on k.LockKey(p) and, for a kind with a Claim, the claim. A nil
// *Owned means the returned Result is final (already_owned naming the
// owner, unavailable, already_completed, lost, failed) and its events were
// emitted. Otherwise the Result names the owner and fence with no outcome
// yet, and the caller must call Execute (an HTTP caller answers 202 first).
func (r *Runner) Begin(ctx context.Context, k Kind, p Params, t job.Trigger) (*Owned, job.Result) {
	spec := k.Spec()
	key := k.LockKey(p)
	o := &Owned{r: r, kind: k, worker: r.workers[spec.Name], params: p, start: time.Now(),
		res: job.Result{Job: spec.Name, Key: key, Replica: r.replica, RequestID: t.RequestID}}
	o.res.Resumable = o.worker != nil && o.worker.incomplete != nil
	log := r.log.With("job", spec.Name, "lock_key", key, "request_id", t.RequestID, "trigger", string(t.Source))
	if t.RequestedBy != "" {
		log = log.With("requested_by", t.RequestedBy)
	}
	if t.Principal != "" {
		log = log.With("principal", t.Principal)
	}
	o.run = &Run{job: spec.Name, key: key, replica: r.replica, trigger: t, emit: r.emit, log: log, completionID: events.NewID()}
	o.run.startTrace(ctx, r.tracer)
	switch {
	case o.worker == nil:
		return nil, o.fail(ctx, fmt.Errorf("owned: kind %q is not registered with this Runner", spec.Name))
	case p.kind != spec.Name:
		return nil, o.fail(ctx, fmt.Errorf("owned: kind %q given the params of kind %q", spec.Name, p.kind))
	case !strings.HasPrefix(key, spec.Name+":"):
		return nil, o.fail(ctx, fmt.Errorf("owned: kind %q locks %q, outside its namespace %q", spec.Name, key, spec.Name+":"))
	}
	if res, done := o.alreadyCompleted(ctx); done {
		return nil, res
	}
	if o.worker.lease != nil {
		o.lease = o.worker.lease(p)
	}

	if !o.acquire(ctx) {
		return nil, o.res
	}
	if o.worker.claim == nil {
		return o, o.res
	}
	cctx, done := o.underLease(ctx)
	cctx, span := o.run.child(cctx, "run.claim", AttrLockFence.Int64(o.run.lockFence))
	fence, err := o.worker.claim(cctx, o.run, p)
	cause := done()
	if err != nil {
		span.SetAttributes(attribute.String("coordinator.claim", claimRefusal(err)))
		span.End()
		return nil, o.claimRefused(ctx, err, cause)
	}
	span.SetAttributes(AttrFence.Int64(fence))
	span.End()
	o.run.fence, o.res.Fence = fence, fence
	o.run.log = o.run.log.With("fence", fence)
	o.run.log.Info("run_claimed", "owner", r.replica, "lock_fence", o.run.lockFence)
	return o, o.res
}

// DataBeforeLock marks a run.already_completed answered before the lock
// was taken (Worker.AlreadyCompleted): nothing was acquired, so no lock
// fence.
const DataBeforeLock = "before_lock"

// alreadyCompleted asks the kind's AlreadyCompleted, before the lock,
// whether the run is complete for good. done: the run ended
// already_completed, with its events emitted; otherwise the lock is taken
// as ever (the kind's error is logged).
func (o *Owned) alreadyCompleted(ctx context.Context) (job.Result, bool) {
	if o.worker.completed == nil {
		return job.Result{}, false
	}
	cctx, span := o.run.child(ctx, "run.check")
	ce, err := o.worker.completed(cctx, o.run, o.params)
	if err != nil || ce == nil {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
			o.run.log.Warn("run_check_failed", "error", err, "detail", "taking the lock")
		}
		span.End()
		return job.Result{}, false
	}
	span.SetAttributes(attribute.String("coordinator.claim", "already_completed"), AttrOwner.String(ce.Owner), AttrFence.Int64(ce.Fence))
	span.End()
	o.res.Owner, o.res.Fence, o.res.Counts = ce.Owner, ce.Fence, ce.Counts
	o.run.send(ctx, events.RunAlreadyCompleted, ce.Fence, ce.Owner, countsData(ce.Counts, map[string]any{DataBeforeLock: true}))
	o.run.log.Info("run_already_completed", "owner", ce.Owner, "fence", ce.Fence, DataBeforeLock, true)
	return o.end(job.OutcomeAlreadyCompleted), true
}

// acquire takes the lock; false means o.res is final.
func (o *Owned) acquire(ctx context.Context) bool {
	ttl := o.lease.TTL
	if ttl > 0 && o.lease.MinHold > 0 {
		ttl = max(ttl, holdTTL(o.lease.MinHold))
	}
	actx, span := o.run.child(ctx, "lock.acquire", AttrLockKey.String(o.run.key), attribute.Int64("coordinator.lease_ms", ttl.Milliseconds()))
	held, err := o.r.locker.Acquire(actx, o.run.key, ttl)
	if err != nil {
		refusedSpan(span, err)
		o.refused(ctx, err)
		return false
	}
	span.SetAttributes(AttrLockFence.Int64(held.Fence()))
	span.End()
	o.held = held
	o.run.lease, o.run.acquired = held, time.Now()
	o.run.lockFence, o.run.fence = held.Fence(), held.Fence()
	o.res.Owner, o.res.Fence = held.Owner(), held.Fence()
	o.run.log = o.run.log.With("lock_fence", held.Fence())
	data := map[string]any{}
	if ttl > 0 {
		data["lease_ms"] = ttl.Milliseconds()
	}
	o.run.send(ctx, events.OwnershipAcquired, held.Fence(), "", data)
	return true
}

// holdTTL is an explicit lease long enough that its local trust deadline
// (TTL minus the adapter's margin, TTL/20 + 2ms) falls after acquired +
// minHold, where the deferred release runs.
func holdTTL(minHold time.Duration) time.Duration {
	return minHold + minHold/10 + 100*time.Millisecond
}

// refused ends a run whose lock was not taken: fail closed, nothing ran.
func (o *Owned) refused(ctx context.Context, err error) {
	o.res.Error = err.Error()
	code := map[string]any{"code": ownership.CodeLockAcquisitionFailed}
	var ae *ownership.AcquireError
	switch {
	case errors.Is(err, ownership.ErrAlreadyOwned):
		if errors.As(err, &ae) {
			o.res.Owner = ae.Owner
		}
		code["reason"] = string(ownership.ReasonAlreadyOwned)
		o.run.send(ctx, events.OwnershipAlreadyOwned, 0, o.res.Owner, code)
		o.run.log.Info("run_already_owned", "owner", o.res.Owner)
		o.end(job.OutcomeAlreadyOwned)
	case errors.Is(err, ownership.ErrUnavailable):
		code["reason"] = string(ownership.ReasonUnavailable)
		code["error"] = err.Error()
		o.run.send(ctx, events.OwnershipUnavailable, 0, "", code)
		o.run.log.Warn("run_lock_unavailable", "error", err)
		o.end(job.OutcomeUnavailable)
	default: // an invalid key: a kind's bug, never retried into success
		o.fail(ctx, err)
	}
}

// fail ends a run that never held its lock as failed.
func (o *Owned) fail(ctx context.Context, err error) job.Result {
	o.res.Error = err.Error()
	o.badInput = errors.Is(err, job.ErrBadInput)
	o.run.send(ctx, events.RunFailed, 0, "", map[string]any{"error": o.res.Error, "retryable": false})
	o.run.log.Error("run_failed", "error", err)
	return o.end(job.OutcomeFailed)
}

// claimRefused ends a run whose claim was not taken: already completed,
// lost, or failed. The lock is released.
func (o *Owned) claimRefused(ctx context.Context, err, cause error) job.Result {
	var ce *CompletedError
	if errors.As(err, &ce) {
		o.res.Owner, o.res.Fence, o.res.Counts = ce.Owner, ce.Fence, ce.Counts
		o.run.send(ctx, events.RunAlreadyCompleted, ce.Fence, ce.Owner, countsData(ce.Counts, nil))
		o.run.log.Info("run_already_completed", "owner", ce.Owner, "fence", ce.Fence)
		o.release(ctx)
		return o.end(job.OutcomeAlreadyCompleted)
	}
	outcome := o.settle(ctx, Report{}, err, cause)
	return o.end(outcome)
}

// underLease derives the context work runs under: cancelled when the lease
// ends, and with cause ErrShutdown when ctx does. done stops the link and
// returns the cause, if any.
func (o *Owned) underLease(ctx context.Context) (context.Context, func() error) {
	// The lease's context has the values of Acquire's, not the run's span.
	wctx, cancel := context.WithCancelCause(o.run.inSpan(o.held.Context()))
	stop := context.AfterFunc(ctx, func() { cancel(ErrShutdown) })
	return wctx, func() error {
		stop()
		cause := context.Cause(wctx)
		cancel(nil)
		return cause
	}
}

// Execute runs the kind's work under the lease, ends the run and releases
// the lock (after the minimum hold, when the kind has one). ctx cancelled
// or the lease lost: the kind stops at its next checkpoint and the outcome
// is lost. A second call returns a failed Result and does nothing.
func (o *Owned) Execute(ctx context.Context) job.Result {
	if !o.executed.CompareAndSwap(false, true) {
		res := o.res
		res.Outcome, res.Error = job.OutcomeFailed, "owned: Execute called twice"
		return res
	}
	o.r.m.running(o.run.job, 1)
	defer o.r.m.running(o.run.job, -1)
	o.run.prog.began.Store(time.Now().UnixNano())
	o.r.inFlight.add(o.run)
	stopProgress := o.r.progress.Track(o.run)
	wctx, done := o.underLease(ctx)
	rep, err := o.worker.run(wctx, o.run, o.params)
	cause := done()
	stopProgress()
	o.r.inFlight.remove(o.run)
	return o.end(o.settle(ctx, rep, err, cause))
}
