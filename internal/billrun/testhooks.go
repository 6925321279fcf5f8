//go:build testhooks

package billrun

import (
	"context"
	"time"
)

// WithBatchDelay returns c with every batch waiting d before its
// transaction starts, so process tests (kill -9 mid-run, SIGSTOP of the
// owner, shutdown mid-run) catch a run in the middle. It exists only in
// binaries built with -tags testhooks.
func WithBatchDelay(c Config, d time.Duration) Config {
	c.beforeBatch = func(ctx context.Context, _, _ int64) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return c
}
