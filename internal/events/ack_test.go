package events_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/events"
)

type acker struct{ acks int }

func (a *acker) Emit(context.Context, events.Event) {}
func (a *acker) EmitAcked(_ context.Context, _ events.Event, onAcked func()) {
	a.acks++
	onAcked()
}

// Multi forwards the callback to its Ackers and calls it once however many
// acknowledge; plain emitters only get the event.
func TestMultiForwardsAcknowledgementOnce(t *testing.T) {
	rec := &events.Recorder{}
	a, b := &acker{}, &acker{}
	calls := 0
	events.EmitAcked(context.Background(), events.Multi{rec, a, b}, events.Event{Type: events.RunCompleted}, func() { calls++ })
	require.Equal(t, 1, calls)
	require.Equal(t, 1, a.acks)
	require.Equal(t, 1, b.acks)
	require.Len(t, rec.Events(), 1)
	require.NotEmpty(t, rec.Events()[0].ID, "Multi names the event once for all")

	calls = 0
	events.EmitAcked(context.Background(), rec, events.Event{Type: events.RunCompleted}, func() { calls++ })
	require.Zero(t, calls, "an emitter without acknowledgement never calls back")
}
