package trigger

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/telemetry"
)

// traceRecord starts the receipt span of one try at handling rec ("<topic>
// process", child of the record's traceparent) under the consumer's handle
// context; end records the outcome and ends it. Tracing off: the context
// only carries the record's traceparent, for the run's events.
func (c *KafkaConsumer) traceRecord(rec *kgo.Record, t job.Trigger) (context.Context, func(job.Result)) {
	ctx, span := c.cfg.Tracing.Process(c.handleCtx, rec)
	if !span.IsRecording() {
		return ctx, func(job.Result) {}
	}
	span.SetAttributes(owned.AttrRequestID.String(t.RequestID))
	return ctx, func(res job.Result) {
		span.SetAttributes(owned.AttrJob.String(res.Job), owned.AttrOutcome.String(string(res.Outcome)),
			attribute.Bool("coordinator.trigger_handled", res.Handled()))
		if !res.Handled() {
			span.SetStatus(codes.Error, "not handled: retried")
		}
		span.End()
	}
}

// recordTraceParent is rec's W3C traceparent header ("" when none).
func recordTraceParent(rec *kgo.Record) string {
	for _, h := range rec.Headers {
		if h.Key == "traceparent" {
			if tp, _ := telemetry.TraceParentOf(string(h.Value)); tp != "" {
				return tp
			}
		}
	}
	return ""
}
