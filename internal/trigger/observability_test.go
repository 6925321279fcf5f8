package trigger_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/telemetry"
	"github.com/telco-platform/coordinator/internal/trigger"
)

// lagOf reads coordinator_trigger_consumer_lag for topic/partition; ok
// false when the series does not exist.
func lagOf(t *testing.T, reg *prometheus.Registry, topic string, partition int32) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "coordinator_trigger_consumer_lag" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["topic"] == topic && labels["partition"] == strconv.Itoa(int(partition)) {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// A partition stuck on its first record (the lock backend keeps answering
// unavailable, so nothing is ever handled or committed) must still export
// its lag: the gauge follows every fetch, not only commits.
func TestStuckPartitionExportsItsLag(t *testing.T) {
	t.Parallel()
	b := setupKafka(t)
	first := b.produce(t, b.bills, "2026-01", `{"period":"2026-01","request_id":"a"}`)
	b.produce(t, b.bills, "2026-01", `{"period":"2026-01","request_id":"b"}`)
	b.produce(t, b.bills, "2026-01", `{"period":"2026-01","request_id":"c"}`)

	h := newFake(func(int, call) job.Outcome { return job.OutcomeUnavailable })
	reg := prometheus.NewRegistry()
	m := trigger.NewMetrics(reg)
	b.consumerWith(t, h, m)
	h.waitCalls(t, 2) // the first record, retried: stuck

	lag, ok := lagOf(t, reg, b.bills, first.Partition)
	require.True(t, ok, "a stuck partition exports its lag")
	require.Equal(t, float64(3), lag, "none of the three records is handled")
}

type handlerFunc func(ctx context.Context, k owned.Kind, p owned.Params, t job.Trigger) (job.Result, error)

func (f handlerFunc) Run(ctx context.Context, k owned.Kind, p owned.Params, t job.Trigger) (job.Result, error) {
	return f(ctx, k, p, t)
}

// With tracing off, a record's traceparent header still reaches the run
// (its events carry it), and a rejected record's trigger.rejected event
// carries it too.
func TestRecordTraceParentReachesTheRunWithTracingOff(t *testing.T) {
	t.Parallel()
	b := setupKafka(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	got := make(chan string, 1)
	b.consumer(t, handlerFunc(func(ctx context.Context, k owned.Kind, _ owned.Params, _ job.Trigger) (job.Result, error) {
		s, _ := telemetry.TraceParent(trace.SpanContextFromContext(ctx))
		got <- s
		return job.Result{Job: k.Spec().Name, Outcome: job.OutcomeCompleted}, nil
	}), nil)
	b.produce(t, b.bills, "2026-01", `{"period":"2026-01"}`, kgo.RecordHeader{Key: "traceparent", Value: []byte(tp)})
	require.Equal(t, tp, <-got)

	b.produce(t, b.bills, "2026-01", `{not json`, kgo.RecordHeader{Key: "traceparent", Value: []byte(tp)})
	waitEvents(t, b.rec, events.TriggerRejected, 1)
	require.Equal(t, tp, b.rec.OfType(events.TriggerRejected)[0].TraceParent)
}
