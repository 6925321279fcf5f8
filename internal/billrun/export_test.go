package billrun

import (
	"context"
	"time"

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

// Reconcile runs the completion's count (sqlReconcile) for period p, its
// instants and cutoff, in a transaction with the completion's planner
// settings (sqlCompleteFence's), and rolls back.
func Reconcile(ctx context.Context, pool *pgxpool.Pool, p Period, start, end, cutoff time.Time) (population, missing int64, err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `select set_config('enable_nestloop', 'off', true), set_config('jit', 'off', true)`); err != nil {
		return 0, 0, err
	}
	var invoiced int64
	err = tx.QueryRow(ctx, sqlReconcile, p.String(), start, end, cutoff).Scan(&population, &missing, &invoiced)
	return population, missing, err
}
