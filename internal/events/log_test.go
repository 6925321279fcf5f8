package events_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/events"
)

func TestLogEmitterWritesOneStructuredLinePerEvent(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	em := events.NewLogEmitter(slog.New(slog.NewJSONHandler(&buf, nil)))
	em.Emit(context.Background(), events.Event{ID: "e1", Type: events.OwnershipAlreadyOwned, Key: "billrun:2026-11", Job: "billrun",
		Replica: "r2", Trigger: "kafka", RequestID: "req-1", Owner: "r1", Extra: map[string]any{"reason": "already_owned"}})
	em.Emit(context.Background(), events.Event{ID: "e2", Type: events.RunCompleted, Key: "msisdn-reaper:sweep", Job: "msisdn-reaper",
		Fence: 7, Extra: map[string]any{"freed": int64(12)}})

	em.Emit(context.Background(), events.Event{Type: events.OwnershipUnavailable, Key: "billrun:2026-11"})

	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	require.Len(t, lines, 3)
	var first, second, third map[string]any
	require.NoError(t, json.Unmarshal(lines[0], &first))
	require.NoError(t, json.Unmarshal(lines[1], &second))
	require.NoError(t, json.Unmarshal(lines[2], &third))
	require.Equal(t, "WARN", third["level"], "an unavailable lock backend is a warning")

	require.Equal(t, "ownership_event", first["msg"])
	require.Equal(t, "INFO", first["level"], "already_owned is routine, not a warning")
	require.Equal(t, "ownership.already_owned", first["type"])
	require.Equal(t, "billrun:2026-11", first["lock_key"])
	require.Equal(t, "r1", first["owner"])
	require.Equal(t, "req-1", first["request_id"])
	require.Equal(t, "already_owned", first["reason"])
	require.NotContains(t, first, "fence", "no fence, no key")

	require.Equal(t, "INFO", second["level"])
	require.Equal(t, float64(7), second["fence"])
	require.Equal(t, float64(12), second["freed"])
}

func TestEventsCarryTheRunsTraceContext(t *testing.T) {
	t.Parallel()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	e := events.Event{ID: "e1", Type: events.RunCompleted, Key: "billrun:2026-11", TraceParent: tp, TraceState: "vendor=x"}
	b, err := json.Marshal(e)
	require.NoError(t, err)
	var ce map[string]any
	require.NoError(t, json.Unmarshal(b, &ce))
	require.Equal(t, tp, ce["traceparent"], "the CloudEvents distributed-tracing extension, a top-level attribute")
	require.Equal(t, "vendor=x", ce["tracestate"])

	b, err = json.Marshal(events.Event{ID: "e2", Type: events.RunCompleted, Key: "k"})
	require.NoError(t, err)
	require.NotContains(t, string(b), "traceparent", "no trace context, no extension")

	var buf bytes.Buffer
	events.NewLogEmitter(slog.New(slog.NewJSONHandler(&buf, nil))).Emit(context.Background(), e)
	var line map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line))
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", line["trace_id"])
	require.Equal(t, "", events.TraceID("garbage"))
}
