package owned

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// Runner is the one owned-run template: for every kind it takes the lock,
// claims where the kind has a claim, runs the kind's work under the lease,
// maps what happened to an outcome, emits the ownership events, releases,
// and records metrics. Kinds only do their work; transports only decode
// triggers and call Run (or Begin and Execute).
//
// Safe for concurrent use. One per process.
type Runner struct {
	reg     *Registry
	workers map[string]Worker
	locker  ownership.Locker
	emit    events.Emitter
	replica string
	log     *slog.Logger
	m       *metrics

	tracer   trace.Tracer // nil: tracing off
	progress ProgressReporter
	inFlight inFlight
	requests *requests // nil: no database, nothing recorded for the resumer
	history  RunHistory
}

// NewRunner configures (Configurer) and opens every registered kind with d
// (nothing is contacted) and returns the template that runs them. The
// replica id is d.Config.ReplicaID, else the Locker's owner. emit may be
// nil.
func NewRunner(reg *Registry, d Deps, emit events.Emitter) (*Runner, error) {
	if reg == nil || d.Locker == nil {
		return nil, errors.New("owned: NewRunner needs a Registry and a Locker")
	}
	if emit == nil {
		emit = events.Multi{}
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	r := &Runner{reg: reg, workers: map[string]Worker{}, locker: d.Locker, emit: emit, log: d.Log,
		replica: d.Config.ReplicaID, progress: d.Progress, history: d.History}
	if d.Telemetry.Enabled() {
		r.tracer = d.Telemetry.Tracer(TracerName)
	}
	if r.progress == nil {
		interval := d.Config.ProgressInterval
		if interval == 0 {
			interval = DefaultProgressInterval
		}
		r.progress = ProgressLog(interval)
	}
	if r.replica == "" {
		r.replica = d.Locker.Owner()
	}
	reg.Configure(d.Config)
	if d.DB != nil {
		r.requests = &requests{pool: d.DB}
	}
	for _, k := range reg.Kinds() {
		name := k.Spec().Name
		w, err := k.Open(d)
		if err != nil {
			return nil, fmt.Errorf("owned: open kind %q: %w", name, err)
		}
		if _, ok := k.(StatusKind); ok {
			if _, ok := w.(StatusReader); !ok {
				return nil, fmt.Errorf("owned: kind %q has run ids (StatusKind) but its Worker is no StatusReader", name)
			}
		}
		r.workers[name] = w
	}
	var err error
	if r.m, err = newMetrics(d.Registerer, &r.inFlight); err != nil {
		return nil, err
	}
	return r, nil
}

// InFlight is the progress of the runs this Runner is executing now.
func (r *Runner) InFlight() []Progress { return r.inFlight.snapshot() }

// Registry is the kinds this Runner runs.
func (r *Runner) Registry() *Registry { return r.reg }

// Replica is the id the Runner writes into results and events.
func (r *Runner) Replica() string { return r.replica }

// Worker returns the opened Worker of the kind named name (nil if none):
// cron asks it for its Scheduler.
func (r *Runner) Worker(name string) Worker { return r.workers[name] }

// Status answers GET HTTPPath/{id} for k: ErrNotFound when k keeps no
// run state.
func (r *Runner) Status(ctx context.Context, k Kind, id string) (any, error) {
	sr, ok := r.workers[k.Spec().Name].(StatusReader)
	if !ok {
		return nil, ErrNotFound
	}
	return sr.Status(ctx, id)
}

// Run is Begin and, when the run is owned, Execute: one owned run to its
// end, under ctx.
func (r *Runner) Run(ctx context.Context, k Kind, p Params, t job.Trigger) job.Result {
	o, res := r.Begin(ctx, k, p, t)
	if o == nil {
		return res
	}
	return o.Execute(ctx)
}

// Owned is a run whose lock is held (and whose claim is taken). Call
// Execute exactly once.
type Owned struct {
	r      *Runner
	kind   Kind
	worker Worker
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

// Fence is the claim's fence (Claimer), else the lock's.
func (o *Owned) Fence() int64 { return o.run.fence }

// Begin takes the lock on k.LockKey(p) and, for a Claimer, the claim. A nil
// *Owned means the returned Result is final (already_owned naming the
// owner, unavailable, already_completed, lost, failed) and its events were
// emitted. Otherwise the Result names the owner and fence with no outcome
// yet, and the caller must call Execute (an HTTP caller answers 202 first).
func (r *Runner) Begin(ctx context.Context, k Kind, p Params, t job.Trigger) (*Owned, job.Result) {
	spec := k.Spec()
	key := k.LockKey(p)
	o := &Owned{r: r, kind: k, worker: r.workers[spec.Name], params: p, start: time.Now(),
		res: job.Result{Job: spec.Name, Key: key, Replica: r.replica, RequestID: t.RequestID}}
	_, o.res.Resumable = o.worker.(Resumable)
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
	case !strings.HasPrefix(key, spec.Name+":"):
		return nil, o.fail(ctx, fmt.Errorf("owned: kind %q locks %q, outside its namespace %q", spec.Name, key, spec.Name+":"))
	}
	if res, done := o.alreadyCompleted(ctx); done {
		return nil, res
	}
	if l, ok := o.worker.(Leaser); ok {
		o.lease = l.Lease(p)
	}

	if !o.acquire(ctx) {
		return nil, o.res
	}
	c, ok := o.worker.(Claimer)
	if !ok {
		return o, o.res
	}
	cctx, done := o.underLease(ctx)
	cctx, span := o.run.child(cctx, "run.claim", AttrLockFence.Int64(o.run.lockFence))
	fence, err := c.Claim(cctx, o.run, p)
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
// was taken (CompletedChecker): nothing was acquired, so no lock fence.
const DataBeforeLock = "before_lock"

// alreadyCompleted asks a CompletedChecker, before the lock, whether the
// run is complete for good. done: the run ended already_completed, with its
// events emitted; otherwise the lock is taken as ever (the checker's error
// is logged).
func (o *Owned) alreadyCompleted(ctx context.Context) (job.Result, bool) {
	cc, ok := o.worker.(CompletedChecker)
	if !ok {
		return job.Result{}, false
	}
	cctx, span := o.run.child(ctx, "run.check")
	ce, err := cc.AlreadyCompleted(cctx, o.run, o.params)
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
	rep, err := o.worker.Run(wctx, o.run, o.params)
	cause := done()
	stopProgress()
	o.r.inFlight.remove(o.run)
	return o.end(o.settle(ctx, rep, err, cause))
}

// settle maps what the work returned to an outcome, emits the run's last
// event and releases the lock.
func (o *Owned) settle(ctx context.Context, rep Report, err, cause error) job.Outcome {
	o.res.Counts = rep.Counts
	outcome, reason := o.classify(err, cause)
	data := countsData(rep.Counts, rep.Data)
	switch outcome {
	case job.OutcomeCompleted:
		if cr, ok := o.worker.(CompletionRecorder); ok && cr.RecordsCompletion(o.params) {
			// At least once: the id the Worker stored with the completion,
			// and the store marks it published only once the sink
			// acknowledged that event; the resumers re-publish it otherwise
			// (CompletionRecorder).
			o.run.sendAcked(ctx, events.RunCompleted, o.run.fence, "", data, o.run.completionID,
				o.r.markPublished(cr, o.params, o.run.fence, o.run.log))
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
func (r *Runner) markPublished(cr CompletionRecorder, p Params, fence int64, log *slog.Logger) func() {
	return func() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
			defer cancel()
			if err := cr.CompletionPublished(ctx, p, fence); err != nil {
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
			time.AfterFunc(remaining, func() {
				relCtx, cancel := context.WithTimeout(context.Background(), ownership.ReleaseTimeout)
				defer cancel()
				if err := held.Release(relCtx); err != nil && !errors.Is(err, ownership.ErrNotHeld) {
					log.Warn("run_release_failed", "error", err)
				}
			})
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
// Resumable kind), records metrics and tells an Observer.
func (o *Owned) end(outcome job.Outcome) job.Result {
	o.res.Outcome = outcome
	o.res.BadInput = outcome == job.OutcomeFailed && o.badInput
	o.settleRequest()
	took := time.Since(o.start)
	o.res.DurationMS = took.Milliseconds()
	o.r.m.ended(o.run.job, outcome, took)
	o.recordHistory()
	if obs, ok := o.worker.(Observer); ok {
		obs.Observe(o.res)
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

// settleRequest records, for a Resumable kind, what the run's end means for
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
