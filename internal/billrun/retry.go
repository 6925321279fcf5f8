package billrun

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/telco-platform/coordinator/internal/postgres"
)

// retrier retries a run's statements after transient Postgres errors
// (lost connection, admin shutdown, serialization failure, deadlock).
type retrier struct {
	cfg Config
	log *slog.Logger
}

// retry runs fn until it succeeds, fails with a non-transient error, ctx
// ends, or MaxBatchAttempts tries are spent.
func (r retrier) retry(ctx context.Context, what string, fn func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil || ctx.Err() != nil || !transientErr(err) || attempt >= r.cfg.MaxBatchAttempts {
			return err
		}
		delay := backoff(r.cfg.RetryBackoff, attempt)
		r.log.Warn("billrun_retry", "step", what, "attempt", attempt, "delay_ms", delay.Milliseconds(), "error", err)
		if !sleep(ctx, delay) {
			return ctx.Err()
		}
	}
}

// retryUntil is retry bounded by ctx only, with the backoff capped at 1s.
func (r retrier) retryUntil(ctx context.Context, what string, fn func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil || ctx.Err() != nil || !transientErr(err) {
			return err
		}
		delay := min(backoff(r.cfg.RetryBackoff, attempt), time.Second)
		r.log.Warn("billrun_retry", "step", what, "attempt", attempt, "delay_ms", delay.Milliseconds(), "error", err)
		if !sleep(ctx, delay) {
			return err
		}
	}
}

// transientErr says whether asking again may answer otherwise: Postgres'
// transient errors, but not the run's own verdicts, which carry no
// SQLSTATE and so would pass postgres.IsTransient for a network error: a
// fence found superseded, a gap the repair left open.
func transientErr(err error) bool {
	var unrec *UnreconciledError
	if errors.Is(err, errNotOurs) || errors.Is(err, errFenceLost) || errors.As(err, &unrec) {
		return false
	}
	return postgres.IsTransient(err)
}

// backoff is base doubled per attempt, capped at 32x.
func backoff(base time.Duration, attempt int) time.Duration {
	return base << min(attempt-1, 5)
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
