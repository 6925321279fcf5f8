package billrun

import (
	"cmp"
	"context"
	"log/slog"
	"time"
)

// The defaults of Config.BatchSize and Config.Workers (and of their
// COORDINATOR_BILLRUN_* variables). Batches of 2500 measured faster than
// 1000 on 1M subscribers (BENCHMARKS.md: a batch's fixed cost, its planning,
// fence and record, is spread over more rows) and flat across 2-6 workers.
const (
	DefaultBatchSize = 2500
	DefaultWorkers   = 4
)

// Config tunes the bill-run Worker. Zero fields take the deployment's
// configuration where it has the setting, else the defaults named here.
type Config struct {
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
	// Logger gets the run's log lines. Default: the deployment's.
	Logger *slog.Logger
	// Metrics records the coordinator_billrun_ series. Default: new ones
	// on the deployment's registerer.
	Metrics *Metrics
	// Calendar is the billing zone, the age limit and the clock. Unset
	// fields take the deployment's (COORDINATOR_BILLING_TZ,
	// COORDINATOR_BILLRUN_MAX_AGE_MONTHS), else UTC and 24 months.
	Calendar Calendar

	// beforeBatch is a test seam (export_test.go, and binaries built with
	// -tags testhooks): it runs in the worker before each batch transaction,
	// under the run's context. An error that is not the context's fails the
	// run.
	beforeBatch func(ctx context.Context, firstID, lastID int64) error
}

func (c Config) withDefaults() Config {
	c.BatchSize = max(cmp.Or(c.BatchSize, DefaultBatchSize), 1)
	c.Workers = max(cmp.Or(c.Workers, DefaultWorkers), 1)
	c.MaxBatchAttempts = max(cmp.Or(c.MaxBatchAttempts, 5), 1)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, 200*time.Millisecond)
	c.IdleInTransactionTimeout = cmp.Or(c.IdleInTransactionTimeout, 10*time.Second)
	c.ConflictSample = cmp.Or(c.ConflictSample, 20)
	c.Calendar = c.Calendar.withDefaults()
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
