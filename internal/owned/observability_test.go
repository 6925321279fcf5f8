package owned_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/telemetry"
)

// logSink collects JSON log lines and signals each one.
type logSink struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines []map[string]any
	wrote chan struct{}
}

func newLogSink() *logSink { return &logSink{wrote: make(chan struct{})} }

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p)
	for {
		line, err := s.buf.ReadBytes('\n')
		if err != nil {
			s.buf.Write(line)
			break
		}
		var m map[string]any
		if json.Unmarshal(line, &m) == nil {
			s.lines = append(s.lines, m)
		}
	}
	close(s.wrote)
	s.wrote = make(chan struct{})
	return len(p), nil
}

func (s *logSink) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(s, nil)) }

func (s *logSink) all() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]map[string]any(nil), s.lines...)
}

// waitFor returns the first line with message msg, waiting for it.
func (s *logSink) waitFor(t *testing.T, msg string) map[string]any {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		s.mu.Lock()
		lines, ch := s.lines, s.wrote
		s.mu.Unlock()
		for _, l := range lines {
			if l["msg"] == msg {
				return l
			}
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no %s log line; got %v", msg, lines)
		}
	}
}

func gauges(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[labelsOf(m)] = m.GetGauge().GetValue()
		}
	}
	return out
}

func labelsOf(m *dto.Metric) string {
	s := ""
	for _, l := range m.GetLabel() {
		s += l.GetName() + "=" + l.GetValue() + ","
	}
	return s
}

func newRunner(t *testing.T, w *ownedtest.Widget, cfg owned.RunnerConfig) (*owned.Runner, *events.Recorder) {
	t.Helper()
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a", WaitTime: 50 * time.Millisecond, WatchdogTimeout: 3 * time.Second})
	t.Cleanup(func() { _ = l.Close() })
	reg, err := owned.NewRegistry(w.Kind())
	require.NoError(t, err)
	cfg.Locker, cfg.Replica = l, "replica-a"
	rec := &events.Recorder{}
	cfg.Emit = rec
	r, err := owned.NewRunner(reg, cfg)
	require.NoError(t, err)
	return r, rec
}

func TestProgressIsLoggedAndGaugedWhileTheRunIsInFlight(t *testing.T) {
	t.Parallel()
	logs := newLogSink()
	prom := prometheus.NewRegistry()
	committed, gate := make(chan struct{}), make(chan struct{})
	w := &ownedtest.Widget{Work: func(_ context.Context, r *owned.Run, _ int) (owned.Report, error) {
		r.SetTotal(10)
		r.Resumed(2)
		r.Committed(3, 300)
		close(committed)
		<-gate
		r.Committed(5, 500)
		return owned.Report{}, nil
	}}
	runner, _ := newRunner(t, w, owned.RunnerConfig{ProgressInterval: 50 * time.Millisecond, Deps: owned.Deps{Log: logs.logger(), Registerer: prom}})
	done := make(chan job.Result, 1)
	go func() {
		done <- runner.Run(context.Background(), w.Kind(), w.Params(1), job.Trigger{Source: job.SourceCLI, RequestID: "req-1"})
	}()
	<-committed

	line := logs.waitFor(t, "widget_progress")
	require.Equal(t, float64(5), line["batches_committed"], "2 resumed + 3 of this run")
	require.Equal(t, float64(10), line["batches_total"])
	require.Equal(t, float64(50), line["percent"])
	require.Equal(t, float64(300), line["rows"])
	require.Positive(t, line["rows_per_s"])
	require.Contains(t, line, "eta_s")
	require.GreaterOrEqual(t, line["eta_s"], float64(0))
	require.Equal(t, "req-1", line["request_id"])
	require.Equal(t, "widget:1", line["lock_key"])
	require.Equal(t, "widget", line["job"])

	key := "job=widget,key=widget:1,"
	require.Equal(t, map[string]float64{key: 5}, gauges(t, prom, "coordinator_run_progress_batches_committed"))
	require.Equal(t, map[string]float64{key: 10}, gauges(t, prom, "coordinator_run_progress_batches_total"))
	require.Equal(t, map[string]float64{key: 0.5}, gauges(t, prom, "coordinator_run_progress_ratio"))
	require.Contains(t, gauges(t, prom, "coordinator_run_progress_eta_seconds"), key)

	close(gate)
	res := <-done
	require.Equal(t, job.OutcomeCompleted, res.Outcome)
	require.Empty(t, gauges(t, prom, "coordinator_run_progress_batches_committed"), "a run's series go when it ends")
}

func TestProgressBeforeTheTotalIsKnown(t *testing.T) {
	t.Parallel()
	var got owned.Progress
	w := &ownedtest.Widget{Work: func(_ context.Context, r *owned.Run, _ int) (owned.Report, error) {
		r.Committed(4, 40)
		got = r.Progress()
		return owned.Report{}, nil
	}}
	runner, _ := newRunner(t, w, owned.RunnerConfig{})
	require.Equal(t, job.OutcomeCompleted, runner.Run(context.Background(), w.Kind(), w.Params(1), job.Trigger{}).Outcome)
	require.False(t, got.Known())
	require.Equal(t, int64(4), got.BatchesCommitted)
	require.Equal(t, time.Duration(-1), got.ETA)

	attrs := map[string]any{}
	for _, a := range owned.ProgressAttrs(got) {
		attrs[a.Key] = a.Value.Any()
	}
	require.Nil(t, attrs["percent"], "null, not a made-up number")
	require.Nil(t, attrs["eta_s"])
	require.Nil(t, attrs["batches_total"])
	require.Equal(t, "msisdn_reaper_progress", owned.ProgressMessage("msisdn-reaper"))
	require.Equal(t, "billrun_progress", owned.ProgressMessage("billrun"))
}

const remoteParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func withRemoteParent(tp string) context.Context {
	return propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
}

// One run traced: its span is the child of the trigger's, and the lock,
// the claim, the kind's work and every event are children of the run's;
// every event carries the run span's traceparent and every log line of the
// run its trace id and request id.
func TestRunSpansEventsAndLogsShareTheTriggersTrace(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	logs := newLogSink()
	w := &ownedtest.Widget{
		Claim: func(context.Context, *owned.Run, int) (int64, error) { return 7, nil },
		Work: func(ctx context.Context, r *owned.Run, _ int) (owned.Report, error) {
			_, span := r.StartSpan(ctx, "widget.batch")
			span.End()
			r.Log().Info("widget_worked")
			return owned.Report{Counts: map[string]int64{"n": 1}}, nil
		},
	}
	runner, rec := newRunner(t, w, owned.RunnerConfig{Tracer: telemetry.NewForTest(sr, nil).TracerIfOn(owned.TracerName), Deps: owned.Deps{Log: logs.logger()}})
	res := runner.Run(withRemoteParent(remoteParent), w.Kind(), w.Params(1), job.Trigger{Source: job.SourceKafka, RequestID: "req-9"})
	require.Equal(t, job.OutcomeCompleted, res.Outcome)

	spans := sr.Ended()
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	require.Len(t, byName["run widget"], 1)
	run := byName["run widget"][0]
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", run.SpanContext().TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", run.Parent().SpanID().String(), "the run is the trigger's child")
	attrs := map[string]string{}
	for _, a := range run.Attributes() {
		attrs[string(a.Key)] = a.Value.String()
	}
	require.Equal(t, "completed", attrs["coordinator.outcome"])
	require.Equal(t, "req-9", attrs["coordinator.request_id"])
	require.Equal(t, "7", attrs["coordinator.fence"])
	for _, name := range []string{"lock.acquire", "run.claim", "widget.batch", "lock.release",
		"event ownership.acquired", "event run.completed", "event ownership.released"} {
		require.Lenf(t, byName[name], 1, "span %s", name)
		require.Equalf(t, run.SpanContext().SpanID(), byName[name][0].Parent().SpanID(), "%s is the run's child", name)
	}

	want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + run.SpanContext().SpanID().String() + "-01"
	evs := rec.Events()
	require.NotEmpty(t, evs)
	for _, e := range evs {
		require.Equalf(t, want, e.TraceParent, "%s carries the run's traceparent", e.Type)
	}

	lines := 0
	for _, l := range logs.all() {
		if l["lock_key"] == "widget:1" {
			lines++
			require.Equalf(t, "4bf92f3577b34da6a3ce929d0e0e4736", l["trace_id"], "%v", l)
			require.Equalf(t, "req-9", l["request_id"], "%v", l)
		}
	}
	require.GreaterOrEqual(t, lines, 3, "run_claimed, widget_worked, run_ended")
}

// Tracing off: no span is started, and the trigger's traceparent still
// reaches every event and the logs.
func TestTracingOffHandsTheTriggersTraceContextOn(t *testing.T) {
	t.Parallel()
	logs := newLogSink()
	var tracing bool
	w := &ownedtest.Widget{Work: func(ctx context.Context, r *owned.Run, _ int) (owned.Report, error) {
		tracing = r.Tracing()
		_, span := r.StartSpan(ctx, "widget.batch")
		require.False(t, span.IsRecording())
		span.End()
		return owned.Report{}, nil
	}}
	runner, rec := newRunner(t, w, owned.RunnerConfig{Deps: owned.Deps{Log: logs.logger()}})
	require.Equal(t, job.OutcomeCompleted, runner.Run(withRemoteParent(remoteParent), w.Kind(), w.Params(1), job.Trigger{RequestID: "r"}).Outcome)
	require.False(t, tracing)
	for _, e := range rec.Events() {
		require.Equal(t, remoteParent, e.TraceParent)
	}
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", logs.waitFor(t, "run_ended")["trace_id"])

	// No trace context at all: no traceparent and no trace id.
	logs2 := newLogSink()
	runner, rec = newRunner(t, w, owned.RunnerConfig{Deps: owned.Deps{Log: logs2.logger()}})
	require.Equal(t, job.OutcomeCompleted, runner.Run(context.Background(), w.Kind(), w.Params(1), job.Trigger{RequestID: "r"}).Outcome)
	for _, e := range rec.Events() {
		require.Empty(t, e.TraceParent)
	}
	require.NotContains(t, logs2.waitFor(t, "run_ended"), "trace_id")
	require.False(t, trace.SpanContextFromContext(context.Background()).IsValid())
}
