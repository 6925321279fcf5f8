package chaos

import (
	"context"
	"strings"
	"time"

	"github.com/telco-platform/coordinator/internal/localsvc"
)

// The verifier's own services: nothing here touches the shared test
// services. Every server listens on a free loopback port, is a child of the
// verifier (dies with it) and is stopped by its PID.

// freePort is a loopback port nobody listens on, below the ephemeral range
// (localsvc.FreePort).
func freePort() (int, error) { return localsvc.FreePort() }

// pause waits d or until ctx ends; it reports whether d passed.
func pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitFor polls cond every step until it holds, ctx ends or bound passes.
func waitFor(ctx context.Context, bound, step time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(bound)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || !pause(ctx, step) {
			return false
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
