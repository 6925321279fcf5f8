package owned

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
)

// TracerName is the instrumentation scope of the template's spans.
const TracerName = "github.com/telco-platform/coordinator/internal/owned"

// Span attribute keys of the template (and of kinds' spans).
const (
	AttrJob       = attribute.Key("coordinator.job")
	AttrLockKey   = attribute.Key("coordinator.lock_key")
	AttrRequestID = attribute.Key("coordinator.request_id")
	AttrTrigger   = attribute.Key("coordinator.trigger")
	AttrReplica   = attribute.Key("coordinator.replica")
	AttrOutcome   = attribute.Key("coordinator.outcome")
	AttrFence     = attribute.Key("coordinator.fence")
	AttrLockFence = attribute.Key("coordinator.lock_fence")
	AttrOwner     = attribute.Key("coordinator.owner")
)

// The spans of one run, all in the trace of its trigger:
//
//	run <job>              Begin to the outcome (coordinator.outcome)
//	├── lock.acquire        the Locker's Acquire (its Redis commands beneath)
//	├── run.claim           a Claimer's Claim (its SQL beneath)
//	├── <the kind's spans>  billrun.batch, msisdn-reaper.batch, ...
//	├── event <type>        each event emitted (the Kafka publish beneath)
//	└── lock.release        the release (deferred past a minimum hold: none)

// StartSpan starts a span of the run's own work (a batch, say) under ctx,
// which must descend from the context the template gave the kind; the kind
// ends it. With tracing off it returns ctx and a span that does nothing, at
// no cost: check Tracing before building attributes.
func (r *Run) StartSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !r.recording {
		return ctx, trace.SpanFromContext(context.Background())
	}
	return r.tr.Start(ctx, name, trace.WithAttributes(attrs...))
}

// Tracing reports whether the run's spans are recorded: tracing is on and
// the sampler kept the run's trace. An unsampled run starts no span of the
// template's or the kind's (its libraries' spans are unsampled too).
func (r *Run) Tracing() bool { return r.recording }

// TraceParent is the W3C traceparent the run's events carry (empty when
// the run has no trace context).
func (r *Run) TraceParent() string { return r.traceparent }

// startTrace starts the run's span as a child of ctx's (the trigger's
// receipt span, or its remote traceparent), fixes the trace context its
// events carry, and puts the trace id on the run's logger.
func (r *Run) startTrace(ctx context.Context, tr trace.Tracer) {
	sc := trace.SpanContextFromContext(ctx)
	if tr != nil {
		r.tr = tr
		_, r.span = tr.Start(ctx, "run "+r.job, trace.WithAttributes(AttrJob.String(r.job), AttrLockKey.String(r.key),
			AttrRequestID.String(r.trigger.RequestID), AttrTrigger.String(string(r.trigger.Source)), AttrReplica.String(r.replica)))
		sc = r.span.SpanContext()
		r.recording = r.span.IsRecording()
	}
	r.traceparent, r.tracestate = traceParent(sc)
	if sc.IsValid() {
		r.log = r.log.With("trace_id", sc.TraceID().String())
	}
}

// inSpan is ctx with the run's span as the parent of what starts under it.
func (r *Run) inSpan(ctx context.Context) context.Context {
	if r.span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, r.span)
}

// child starts a template span under the run's span.
func (r *Run) child(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !r.recording {
		return r.inSpan(ctx), trace.SpanFromContext(context.Background())
	}
	return r.tr.Start(r.inSpan(ctx), name, trace.WithAttributes(attrs...))
}

// eventSpan covers one event's emission; the Kafka sink's publish span
// nests under it.
func (r *Run) eventSpan(ctx context.Context, e *events.Event) (context.Context, trace.Span) {
	if !r.recording {
		return ctx, trace.SpanFromContext(context.Background())
	}
	return r.child(ctx, "event "+string(e.Type),
		attribute.String("cloudevents.event_id", e.ID), attribute.String("cloudevents.event_type", string(e.Type)),
		attribute.String("cloudevents.event_subject", e.Key), attribute.String("cloudevents.event_source", events.Source),
		attribute.String("cloudevents.event_spec_version", "1.0"))
}

// endTrace ends the run's span with its outcome.
func (r *Run) endTrace(res job.Result) {
	if r.span == nil {
		return
	}
	r.span.SetAttributes(AttrOutcome.String(string(res.Outcome)))
	if res.Fence != 0 {
		r.span.SetAttributes(AttrFence.Int64(res.Fence))
	}
	if res.Owner != "" {
		r.span.SetAttributes(AttrOwner.String(res.Owner))
	}
	for k, v := range res.Counts {
		r.span.SetAttributes(attribute.Int64("coordinator.count."+k, v))
	}
	switch res.Outcome {
	case job.OutcomeFailed, job.OutcomeLost, job.OutcomeUnavailable:
		r.span.SetStatus(codes.Error, res.Error)
	}
	r.span.End()
}

// traceParent is the W3C traceparent of sc and its tracestate (the
// CloudEvents distributed-tracing extension), as the W3C propagator writes
// them; both empty when sc is not valid.
func traceParent(sc trace.SpanContext) (traceparent, tracestate string) {
	if !sc.IsValid() {
		return "", ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c.Get("traceparent"), c.Get("tracestate")
}
