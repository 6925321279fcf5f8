package owned

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// Run is one owned run as its kind sees it: who triggered it, the lease it
// runs under, and a way to emit the kind's own events stamped like the
// template's. The template owns it; a kind reads it and emits through it.
type Run struct {
	job, key, replica string
	trigger           job.Trigger
	lease             ownership.Lease
	lockFence, fence  int64
	acquired          time.Time
	log               *slog.Logger
	emit              events.Emitter
	completionID      string // the id of this run's run.completed (CompletionEventID)

	prog progress

	// Tracing (tracing.go): the tracer (nil when off), the run's span, and
	// the trace context every event carries.
	tr                      trace.Tracer
	span                    trace.Span
	recording               bool // the run's span is recorded (sampled)
	traceparent, tracestate string
}

// Job is the kind's name.
func (r *Run) Job() string { return r.job }

// CompletionEventID is the id the template gives this run's run.completed
// (random, one per run). A kind with Completions stores it with the completion,
// so that a re-publication of a lost event carries the same id.
func (r *Run) CompletionEventID() string { return r.completionID }

// Key is the lock key.
func (r *Run) Key() string { return r.key }

// Replica is this replica's id: the owner it writes into its store.
func (r *Run) Replica() string { return r.replica }

// Trigger is the request that started the run.
func (r *Run) Trigger() job.Trigger { return r.trigger }

// Lease is the held lock. Its Context is cancelled when it is lost.
func (r *Run) Lease() ownership.Lease { return r.lease }

// LockFence is the lock's fencing token.
func (r *Run) LockFence() int64 { return r.lockFence }

// Fence is the claim's fence once claimed (Claimer), else the lock's.
func (r *Run) Fence() int64 { return r.fence }

// Acquired is when the lock was taken (monotonic clock).
func (r *Run) Acquired() time.Time { return r.acquired }

// Log is the run's logger (job, lock_key, request_id, trigger attached, and
// trace_id when the run has a trace context).
func (r *Run) Log() *slog.Logger { return r.log }

// Emit sends one event of the kind's own (billrun.invoice_conflict, say)
// with the run's key, job, replica, trigger, request id, requester and
// principal, and fence, and data.lock_fence. It still goes out after ctx is cancelled.
func (r *Run) Emit(ctx context.Context, typ events.Type, data map[string]any) {
	r.send(ctx, typ, r.fence, "", data)
}

func (r *Run) send(ctx context.Context, typ events.Type, fence int64, owner string, data map[string]any) {
	r.sendAcked(ctx, typ, fence, owner, data, "", nil)
}

// sendAcked is send with the event's id (empty: random) and, when onAcked is
// not nil, a call once the sink acknowledged it (events.Acker).
func (r *Run) sendAcked(ctx context.Context, typ events.Type, fence int64, owner string, data map[string]any, id string, onAcked func()) {
	extra := make(map[string]any, len(data)+1)
	for k, v := range data {
		extra[k] = v
	}
	if r.lockFence != 0 {
		extra["lock_fence"] = r.lockFence
	}
	e := events.Event{
		Type: typ, Key: r.key, Job: r.job, Replica: r.replica, Trigger: string(r.trigger.Source),
		RequestID: r.trigger.RequestID, RequestedBy: r.trigger.RequestedBy, Principal: r.trigger.Principal,
		Fence: fence, Owner: owner, Extra: extra,
		TraceParent: r.traceparent, TraceState: r.tracestate, ID: id,
	}
	if e.ID == "" && r.recording { // the event span names the id; otherwise the sinks give it one
		e.ID = events.NewID()
	}
	ctx, span := r.eventSpan(context.WithoutCancel(ctx), &e)
	if onAcked != nil {
		events.EmitAcked(ctx, r.emit, e, onAcked)
	} else {
		r.emit.Emit(ctx, e)
	}
	span.End()
}

// Lost reasons the template gives (data.reason of ownership.lost); kinds
// add their own through Lost.
const (
	ReasonLeaseLost = "lease_lost" // the lease ended: renewal found the lock gone, or it ran out
	ReasonShutdown  = "shutdown"   // the caller's context ended (the replica is stopping)
	// ReasonReleaseFailed: the release did not reach the backend; the lock
	// expires with its TTL (only on the ownership.lost that ends the term).
	ReasonReleaseFailed = "release_failed"
)

var (
	// ErrLost matches every *LostError.
	ErrLost = errors.New("owned: ownership lost")
	// ErrShutdown is the cause of a run's context when the caller's context
	// ends (Dispatcher.Shutdown, SIGTERM).
	ErrShutdown = errors.New("owned: shutdown")
	// ErrAlreadyCompleted matches every *CompletedError.
	ErrAlreadyCompleted = errors.New("owned: already completed")
)

// LostError ends a run as lost with a reason of the kind's (billrun's
// fence_lost): outcome lost, event ownership.lost, exit 76, a Kafka trigger
// is not committed.
type LostError struct {
	Reason string
	Err    error
}

// Lost builds a *LostError; err may be nil.
func Lost(reason string, err error) error { return &LostError{Reason: reason, Err: err} }

func (e *LostError) Error() string {
	if e.Err == nil {
		return "ownership lost: " + e.Reason
	}
	return fmt.Sprintf("ownership lost: %s: %v", e.Reason, e.Err)
}

func (e *LostError) Unwrap() error        { return e.Err }
func (e *LostError) Is(target error) bool { return target == ErrLost }

// CompletedError is a Claimer's answer when the work was done by an earlier
// run: outcome already_completed (exit 0), event run.already_completed with
// the run that did it.
type CompletedError struct {
	// Owner and Fence name the run that completed the work.
	Owner string
	Fence int64
	// Counts are its totals.
	Counts map[string]int64
}

func (e *CompletedError) Error() string {
	return fmt.Sprintf("already completed by %s (fence %d)", e.Owner, e.Fence)
}

func (e *CompletedError) Is(target error) bool { return target == ErrAlreadyCompleted }
