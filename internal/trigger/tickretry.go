package trigger

import (
	"errors"
	"log/slog"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
)

// Reasons a cron tick was given up before it was done or durable
// (coordinator_trigger_cron_ticks_dropped_total{reason}, cron_tick_dropped).
const (
	// DropNextTick: the schedule's next tick was due before another
	// attempt could run.
	DropNextTick = "next_tick"
	// DropShutdown: the replica stopped (cron stopped, or the dispatcher
	// refused the work) while the tick was being retried.
	DropShutdown = "shutdown"
)

// retryTickUntilDurable runs one tick of j and, while its work is neither
// done nor durable (j.Run returns an error other than ErrShuttingDown), runs
// it again with the same trigger after a backoff (RetryBackoff, doubling,
// capped at RetryMaxBackoff), until it is, the schedule's next tick (next)
// is due before another attempt could end, or the cron stops. A monthly bill
// run whose tick meets Postgres down is thus billed once Postgres is back,
// not next month; every replica retries its own tick, and the lock and the
// claim let one of them run it. A tick given up is logged
// (cron_tick_dropped, error level) and counted
// (coordinator_trigger_cron_ticks_dropped_total{reason}), unless the
// schedule's next tick does the same work (CronJob.Key: the same lock key,
// e.g. every reaper sweep): then nothing is lost, it is logged
// cron_tick_superseded (warn) and not counted.
//
// This is the hook the chaos verifier's "drop a failed cron tick" sabotage
// build disables (failedTickRetried, sabotage.go): one attempt, no retry.
func (cr *Cron) retryTickUntilDurable(j CronJob, next time.Time, t job.Trigger, at time.Time) {
	log := cr.log.With("job", j.Name, "request_id", t.RequestID, "scheduled", at)
	// Another attempt must be over before the next tick fires, or that tick
	// would find this one running and be skipped: an attempt is started
	// only if, taking as long as the last one, it ends a margin (a tenth of
	// the schedule's period, at most 1s) before the next tick.
	margin := min(time.Second, next.Sub(at)/10)
	endsInTime := func(wait, took time.Duration) bool {
		return next.IsZero() || time.Now().Add(wait+took+margin).Before(next)
	}
	for attempt := 1; ; attempt++ {
		began := time.Now()
		err := j.Run(cr.ctx, t, at)
		if err == nil {
			if attempt > 1 {
				log.Info("cron_tick_durable", "attempts", attempt)
			}
			return
		}
		if errors.Is(err, ErrShuttingDown) || cr.ctx.Err() != nil {
			cr.drop(j, next, at, log, DropShutdown, attempt, err)
			return
		}
		took := time.Since(began)
		delay := min(cr.cfg.RetryBackoff<<min(attempt-1, 16), cr.cfg.RetryMaxBackoff)
		if !failedTickRetried || !endsInTime(delay, took) { // chaos_sabotage builds only (sabotage.go)
			cr.drop(j, next, at, log, DropNextTick, attempt, err)
			return
		}
		cr.cfg.Metrics.cronRetry(j.Name)
		log.Warn("cron_tick_retry", "attempt", attempt, "retry_in_ms", delay.Milliseconds(), "error", err,
			"detail", "the tick's run neither finished nor was recorded for the resumer; it is run again")
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-cr.ctx.Done():
			timer.Stop()
			cr.drop(j, next, at, log, DropShutdown, attempt, err)
			return
		}
		if !endsInTime(0, took) { // the wait overran (a busy machine)
			cr.drop(j, next, at, log, DropNextTick, attempt, err)
			return
		}
	}
}

// drop logs and counts a tick of j at at given up before it was done or
// durable, unless the next tick (next) does the same work.
func (cr *Cron) drop(j CronJob, next, at time.Time, log *slog.Logger, reason string, attempts int, err error) {
	if supersededBy(j, at, next) {
		log.Warn("cron_tick_superseded", "reason", reason, "attempts", attempts, "error", err,
			"detail", "the schedule's next tick does the same work")
		return
	}
	cr.cfg.Metrics.cronDropped(j.Name, reason)
	log.Error("cron_tick_dropped", "reason", reason, "attempts", attempts, "error", err,
		"detail", "this replica could not run the tick or record it for the resumer; see docs/runbook.md#coordinatorcrontickdropped")
}

// supersededBy: j's tick at next does the work of its tick at at (the same
// key). False when j has no Key, or either key is unknown.
func supersededBy(j CronJob, at, next time.Time) bool {
	if j.Key == nil || next.IsZero() {
		return false
	}
	a, errA := j.Key(at)
	b, errB := j.Key(next)
	return errA == nil && errB == nil && a == b
}
