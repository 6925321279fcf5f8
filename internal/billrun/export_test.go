package billrun

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/telco-platform/coordinator/internal/owned"
)

// WithBeforeBatch sets the test seam that runs before each batch
// transaction (see Config.beforeBatch).
func WithBeforeBatch(c Config, hook func(ctx context.Context, firstID, lastID int64) error) Config {
	c.beforeBatch = hook
	return c
}

// RecordTotal stores a run's batches_total the way its progress does
// (sqlRecordTotal), for period p under claim fence.
func RecordTotal(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, p Period, fence, batches int64) error {
	_, err := db.Exec(ctx, sqlRecordTotal, p.String(), fence, batches)
	return err
}

// Incomplete is what the Worker lists for the resumer.
func Incomplete(ctx context.Context, pool *pgxpool.Pool) ([]owned.Incomplete[Request], error) {
	return (&Worker{pool: pool}).Incomplete(ctx)
}
