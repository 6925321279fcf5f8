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
	var (
		invoiced int64
		unbilled []int64
	)
	err = tx.QueryRow(ctx, sqlReconcile, p.String(), start, end, cutoff).Scan(&population, &missing, &invoiced, &unbilled)
	return population, missing, err
}

// sqlLateUsageReference and sqlUnbilledReference are the late-usage check as
// it was before issue 28 (adjust.go's sqlLateUsage and sqlUnbilled): every
// invoice of the period, and the population (no cutoff) anti-joined with
// them. The tests hold the check to them.
const sqlLateUsageReference = `
select count(*), coalesce(sum(l.amount), 0)::bigint
from (select u.total - i.usage_cents - coalesce(a.adjusted, 0) as amount
      from invoices i
      cross join lateral (select coalesce(sum(c.amount_cents), 0) as total from usage_charges c
                          where c.subscriber_id = i.subscriber_id and c.period = i.period) u
      cross join lateral (select sum(x.amount_cents) as adjusted from invoice_adjustments x
                          where x.subscriber_id = i.subscriber_id and x.period = i.period) a
      where i.period = $1 and i.usage_cents is not null) l
where l.amount <> 0`

var sqlUnbilledReference = `
select count(*)
from subscribers s
where ` + population("$2", "$3", "'infinity'::timestamptz") + `
  and not exists (select from invoices i where i.subscriber_id = s.id and i.period = $1)`

// LateReference is what the check before issue 28 finds in period p, with
// the instants its bill run recorded: late usage subscribers, their cents,
// unbilled subscribers.
func LateReference(ctx context.Context, pool *pgxpool.Pool, p Period) (subscribers, cents, unbilled int64, err error) {
	if err = pool.QueryRow(ctx, sqlLateUsageReference, p.String()).Scan(&subscribers, &cents); err != nil {
		return 0, 0, 0, err
	}
	var start, end time.Time
	if err = pool.QueryRow(ctx, `select period_start, period_end from bill_runs where period = $1`, p.String()).Scan(&start, &end); err != nil {
		return 0, 0, 0, err
	}
	err = pool.QueryRow(ctx, sqlUnbilledReference, p.String(), start, end).Scan(&unbilled)
	return subscribers, cents, unbilled, err
}

// ExplainKeptCheck is the plan (EXPLAIN (ANALYZE, FORMAT JSON)) of the kept
// late check of period p (sqlLateCached).
func ExplainKeptCheck(ctx context.Context, pool *pgxpool.Pool, p Period) (string, error) {
	var plan string
	err := pool.QueryRow(ctx, "explain (analyze, format json) "+sqlLateCached, p.String(), p.Start(time.UTC), p.End(time.UTC), maxLateIDs).Scan(&plan)
	return plan, err
}

// KeptCheck is one kept late check of p as a trigger reads it
// (sqlLateCached): what refreshLate would write back.
type KeptCheck struct {
	Fence, Version int64
	Snap           string
	IDs            []int64
}

// ReadKeptCheck runs the kept check of p; ok is false without a usable row.
func ReadKeptCheck(ctx context.Context, pool *pgxpool.Pool, p Period) (k KeptCheck, ok bool, err error) {
	var (
		status, owner          string
		batches                int32
		a, b, c, d, e, f, g, h int64
		population, version    *int64
		adjusting              bool
	)
	err = pool.QueryRow(ctx, sqlLateCached, p.String(), p.Start(time.UTC), p.End(time.UTC), maxLateIDs).Scan(
		&status, &owner, &k.Fence, &batches, &a, &b, &c, &d, &population, &adjusting,
		&version, &e, &f, &g, &h, &k.IDs, &k.Snap)
	if err != nil || version == nil {
		return k, false, err
	}
	k.Version = *version
	return k, true, nil
}

// RefreshKeptCheck writes k back as refreshLate does; it returns whether a
// row took it.
func RefreshKeptCheck(ctx context.Context, pool *pgxpool.Pool, p Period, k KeptCheck) (bool, error) {
	tag, err := pool.Exec(ctx, sqlLateRefresh, p.String(), k.Fence, k.Version, k.Snap, k.IDs)
	return tag.RowsAffected() == 1, err
}
