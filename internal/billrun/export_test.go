package billrun

import "context"

// WithBeforeBatch sets the test seam that runs before each batch
// transaction (see Config.beforeBatch).
func WithBeforeBatch(c Config, hook func(ctx context.Context, firstID, lastID int64) error) Config {
	c.beforeBatch = hook
	return c
}
