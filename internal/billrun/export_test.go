package billrun

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
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

// CountToPlan runs the progress total's estimate (sqlCountToPlan) for
// period p, its instants and cutoff, under claim fence.
func CountToPlan(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, p Period, start, end, cutoff time.Time, fence int64) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, sqlCountToPlan, p.String(), start, end, cutoff, fence).Scan(&n)
	return n, err
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
	err = tx.QueryRow(ctx, sqlReconcile, p.String(), start, end, cutoff).Scan(&population, &missing)
	return population, missing, err
}
