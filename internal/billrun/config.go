package billrun

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/telco-platform/coordinator/internal/cronspec"
)

// The defaults of Config.BatchSize and Config.Workers (and of their
// COORDINATOR_BILLRUN_* variables). Batches of 2500 measured faster than
// 1000 on 1M subscribers (BENCHMARKS.md: a batch's fixed cost, its planning,
// fence and record, is spread over more rows) and flat across 2-6 workers.
const (
	DefaultBatchSize = 2500
	DefaultWorkers   = 4
)

// Config configures the bill-run kind. Zero fields take the defaults named
// here; internal/kinds maps the process's configuration (the
// COORDINATOR_BILLRUN_* and COORDINATOR_BILLING_TZ variables) onto it.
type Config struct {
	// Schedule is the robfig/cron spec that bills the previous month when it
	// fires (COORDINATOR_BILLRUN_SCHEDULE); one that names no zone fires in
	// the billing zone. Default empty: not scheduled.
	Schedule string
	// BatchSize is subscribers (of the period's population) per batch
	// transaction.
	// COORDINATOR_BILLRUN_BATCH_SIZE, default DefaultBatchSize.
	BatchSize int
	// Workers is how many batch transactions run at once. The pool needs
	// Workers+2 connections (the planner and the progress count take one
	// briefly).
	// COORDINATOR_BILLRUN_WORKERS, default DefaultWorkers.
	Workers int
	// MaxBatchAttempts bounds the tries of one batch that meets transient
	// errors (lost connection, admin shutdown, serialization failure) or an
	// escaped unique violation. Default 5.
	MaxBatchAttempts int
	// RetryBackoff is the delay before a batch's second try; it doubles per
	// try, capped at 32x. Default 200ms.
	RetryBackoff time.Duration
	// IdleInTransactionTimeout bounds how long an adjustment transaction may
	// sit idle holding its bill_run_adjustments row FOR SHARE (a paused
	// process; a bill run's batch is one statement and never idles): after it,
	// Postgres ends the session, so a new owner's claim is not blocked for
	// longer. Default 10s.
	IdleInTransactionTimeout time.Duration
	// ConflictSample is the most subscriber ids a billrun.invoice_conflict
	// event lists. Default 20.
	ConflictSample int
	// Logger gets the run's log lines. Default: Deps.Log.
	Logger *slog.Logger
	// Metrics records the coordinator_billrun_ series. Default: new ones
	// on Deps.Registerer.
	Metrics *Metrics
	// Calendar is the billing zone (COORDINATOR_BILLING_TZ), the age limit
	// (COORDINATOR_BILLRUN_MAX_AGE_MONTHS) and the clock. Default UTC, 24
	// months, time.Now.
	Calendar Calendar

	// beforeBatch is a test seam (export_test.go, and binaries built with
	// -tags testhooks): it runs in the worker before each batch transaction,
	// under the run's context. An error that is not the context's fails the
	// run.
	beforeBatch func(ctx context.Context, firstID, lastID int64) error
}

// withDefaults fills the zero fields. The Logger stays nil for open to
// fill from Deps.
func (c Config) withDefaults() Config {
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.MaxBatchAttempts = cmp.Or(c.MaxBatchAttempts, 5)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, 200*time.Millisecond)
	c.IdleInTransactionTimeout = cmp.Or(c.IdleInTransactionTimeout, 10*time.Second)
	c.ConflictSample = cmp.Or(c.ConflictSample, 20)
	c.Calendar = c.Calendar.withDefaults()
	return c
}

// Limits of Config's fields (and of their COORDINATOR_BILLRUN_* variables).
const (
	MaxBatchSize    = 100_000
	MaxWorkers      = 256
	MaxMaxAgeMonths = 12_000
)

// validate reports the first field out of range, naming it and its value.
func (c Config) validate() error {
	c = c.withDefaults()
	switch {
	case c.BatchSize < 1 || c.BatchSize > MaxBatchSize:
		return fmt.Errorf("billrun: Config.BatchSize = %d: must be 1..%d", c.BatchSize, MaxBatchSize)
	case c.Workers < 1 || c.Workers > MaxWorkers:
		return fmt.Errorf("billrun: Config.Workers = %d: must be 1..%d", c.Workers, MaxWorkers)
	case c.MaxBatchAttempts < 1:
		return fmt.Errorf("billrun: Config.MaxBatchAttempts = %d: must be at least 1", c.MaxBatchAttempts)
	case c.Calendar.MaxAgeMonths > MaxMaxAgeMonths:
		return fmt.Errorf("billrun: Config.Calendar.MaxAgeMonths = %d: must be 1..%d", c.Calendar.MaxAgeMonths, MaxMaxAgeMonths)
	}
	if c.Schedule != "" {
		if _, err := cronspec.Parse(c.Schedule); err != nil {
			return fmt.Errorf("billrun: Config.Schedule = %q: %w", c.Schedule, err)
		}
	}
	return nil
}
