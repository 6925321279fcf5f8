package telemetry

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TraceParent is the W3C traceparent of sc ("00-<trace id>-<span id>-<flags>")
// and its tracestate; both empty when sc is not a valid span context. It is
// the value of the CloudEvents distributed-tracing extension.
func TraceParent(sc trace.SpanContext) (traceparent, tracestate string) {
	if !sc.IsValid() {
		return "", ""
	}
	return fmt.Sprintf("00-%s-%s-%02x", sc.TraceID(), sc.SpanID(), byte(sc.TraceFlags())), sc.TraceState().String()
}

// Extract returns ctx with the trace context carrier holds as the remote
// parent, read by p's propagator (W3C trace context alone when off).
func (p *Provider) Extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	return p.Propagator().Extract(ctx, carrier)
}

// noopSpan is the span of a context without one: ending it does nothing.
var noopSpan = trace.SpanFromContext(context.Background())

// HeaderCarrier reads headers through get (a Kafka record's, an HTTP
// request's). It cannot be written to.
type HeaderCarrier func(key string) string

func (h HeaderCarrier) Get(key string) string { return h(key) }
func (HeaderCarrier) Set(string, string)      {}
func (HeaderCarrier) Keys() []string          { return nil }

// TraceParentOf parses a traceparent header value and formats it again: a
// malformed value gives "" (it is never echoed into events as it came).
func TraceParentOf(header string) (traceparent, tracestate string) {
	ctx := Off().Extract(context.Background(), HeaderCarrier(func(k string) string {
		if k == "traceparent" {
			return header
		}
		return ""
	}))
	return TraceParent(trace.SpanContextFromContext(ctx))
}
