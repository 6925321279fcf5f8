package owned_test

import (
	"context"
	"fmt"
	"time"

	"github.com/telco-platform/coordinator/internal/events"
)

func types(evs []events.Event) []events.Type {
	out := make([]events.Type, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// waitCtx waits for ctx to end, or fails the run after a bound that no
// passing test reaches.
func waitCtx(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("stopped: %w", context.Cause(ctx))
	case <-time.After(30 * time.Second):
		return fmt.Errorf("test: the run was never stopped")
	}
}
