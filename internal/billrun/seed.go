package billrun

import (
	"cmp"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SeedConfig describes demo data for `coordinator seed`.
type SeedConfig struct {
	// Subscribers is how many subscriber ids to create, from FirstID on.
	Subscribers int64
	// FirstID is the first subscriber id. Default 1.
	FirstID int64
	// SuspendedRatio and TerminatedRatio (0..1, sum at most 1) pick the share
	// of SUSPENDED and TERMINATED subscribers, by a hash of the id (so the
	// same ids get the same status on every machine).
	SuspendedRatio, TerminatedRatio float64
	// Usage adds rated usage for Period: one charge to every third new
	// subscriber, a second to every sixth.
	Usage  bool
	Period Period
	// Reset empties the billing tables (subscribers, usage, invoices, bill
	// runs) first. Without it, seeding is idempotent: existing ids are kept
	// as they are and get no new usage.
	Reset bool
}

// SeedResult counts what Seed created.
type SeedResult struct {
	Subscribers  int64 `json:"subscribers"`
	Active       int64 `json:"active"`
	Suspended    int64 `json:"suspended"`
	Terminated   int64 `json:"terminated"`
	UsageCharges int64 `json:"usage_charges"`
}

const sqlSeedReset = `truncate invoice_adjustments, bill_run_adjustments, bill_run_batches, bill_run_totals, bill_runs, invoices, usage_charges, subscribers`

// sqlSeed creates subscribers $1..$2 in one set-based statement (no per-row
// round trips) and usage charges for the ones it created.
//
// $1 first id, $2 last id, $3 suspended ratio, $4 suspended+terminated ratio,
// $5 usage period, $6 add usage.
const sqlSeed = `
with ins as (
    insert into subscribers (id, msisdn, status, monthly_fee_cents)
    select g,
           '467' || lpad(g::text, 9, '0'),
           case when h < $3 then 'SUSPENDED' when h < $4 then 'TERMINATED' else 'ACTIVE' end,
           1000 + (g % 50) * 100
    from (select g, (hashint8(g)::bigint & 65535) / 65536.0 as h
          from generate_series($1::bigint, $2::bigint) g) s
    on conflict (id) do nothing
    returning id, status
),
usage as (
    insert into usage_charges (subscriber_id, period, amount_cents)
    select i.id, $5, v.amount
    from ins i
    cross join lateral (values ((i.id % 7 + 1) * 25, i.id % 3 = 0), (199, i.id % 6 = 0)) v(amount, keep)
    where $6 and v.keep
    returning 1
)
select count(*),
       count(*) filter (where status = 'ACTIVE'),
       count(*) filter (where status = 'SUSPENDED'),
       count(*) filter (where status = 'TERMINATED'),
       (select count(*) from usage)
from ins`

// Seed creates demo billing data fast (generate_series, one statement).
func Seed(ctx context.Context, pool *pgxpool.Pool, cfg SeedConfig) (SeedResult, error) {
	var res SeedResult
	if cfg.Subscribers < 0 || cfg.SuspendedRatio < 0 || cfg.TerminatedRatio < 0 || cfg.SuspendedRatio+cfg.TerminatedRatio > 1 {
		return res, fmt.Errorf("billrun: seed: subscribers must be >= 0 and ratios within 0..1 with a sum at most 1")
	}
	if cfg.Usage && !cfg.Period.Valid() {
		return res, fmt.Errorf("billrun: seed: usage needs a valid period, got %q", cfg.Period)
	}
	first := cmp.Or(cfg.FirstID, 1)
	if cfg.Reset {
		if _, err := pool.Exec(ctx, sqlSeedReset); err != nil {
			return res, fmt.Errorf("billrun: seed reset: %w", err)
		}
	}
	if cfg.Subscribers == 0 {
		return res, nil
	}
	err := pool.QueryRow(ctx, sqlSeed, first, first+cfg.Subscribers-1, cfg.SuspendedRatio,
		cfg.SuspendedRatio+cfg.TerminatedRatio, cfg.Period.String(), cfg.Usage).
		Scan(&res.Subscribers, &res.Active, &res.Suspended, &res.Terminated, &res.UsageCharges)
	if err != nil {
		return res, fmt.Errorf("billrun: seed: %w", err)
	}
	return res, nil
}
