package billrun

import (
	"context"
	"fmt"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// sqlCompletionPublished records that Kafka acknowledged the run.completed
// of the period's completion under claim fence $2 (completed_event_at):
// the fence names the completion whose event was acknowledged.
//
// $1 period, $2 claim fence.
const sqlCompletionPublished = `
update bill_runs set completed_event_at = clock_timestamp()
where period = $1 and fence = $2 and status = 'COMPLETED' and completed_event_at is null`

// sqlUnpublishedCompletions lists the COMPLETED runs whose run.completed
// (completion_event_id, stored by sqlFinish) no sink acknowledged, finished
// more than $1 seconds ago, oldest first, at most $2
// (bill_runs_completed_event_pending). A row without an id was completed
// before 00014 or by an older replica: never listed.
const sqlUnpublishedCompletions = `
select period, completion_event_id, coalesce(owner, ''), fence, coalesce(lock_fence, 0),
       coalesce(request_id, ''), coalesce(requested_by, ''), coalesce(principal, ''), coalesce(trigger_source, ''),
       batches_done, subscribers, invoices_created, already_invoiced, finished_at, repaired, population
from bill_runs
where status = 'COMPLETED' and completed_event_at is null and completion_event_id is not null
  and finished_at < clock_timestamp() - make_interval(secs => $1)
order by finished_at
limit $2`

// RecordsCompletion: a bill run's completion is recorded
// (bill_runs.completed_event_at); an adjustment run's is not.
func (w *Worker) RecordsCompletion(r Request) bool { return !r.Adjust }

// CompletionPublished marks the period's completion under fence as
// acknowledged (owned.Completions).
func (w *Worker) CompletionPublished(ctx context.Context, r Request, fence int64) error {
	period := r.Period
	if _, err := w.pool.Exec(ctx, sqlCompletionPublished, period.String(), fence); err != nil {
		return fmt.Errorf("billrun: mark %s's run.completed published: %w", period, err)
	}
	return nil
}

// UnpublishedCompletions lists the COMPLETED bill runs whose run.completed
// was not acknowledged, finished more than olderThan ago, with the period's
// totals from bill_runs (owned.Completions).
func (w *Worker) UnpublishedCompletions(ctx context.Context, olderThan time.Duration, limit int) ([]owned.Completion[Request], error) {
	rows, err := w.pool.Query(ctx, sqlUnpublishedCompletions, olderThan.Seconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("billrun: list unpublished completions: %w", err)
	}
	defer rows.Close()
	var out []owned.Completion[Request]
	for rows.Next() {
		var (
			period, eventID, owner, requestID, requestedBy, principal, source string
			fence, lockFence, subs, created, already                          int64
			batches                                                           int32
			finished                                                          time.Time
			repaired                                                          int64
			population                                                        *int64
		)
		if err := rows.Scan(&period, &eventID, &owner, &fence, &lockFence, &requestID, &requestedBy, &principal, &source,
			&batches, &subs, &created, &already, &finished, &repaired, &population); err != nil {
			return nil, fmt.Errorf("billrun: list unpublished completions: %w", err)
		}
		p, err := ParsePeriod(period)
		if err != nil {
			continue // the table's check constraint makes this unreachable
		}
		counts := map[string]int64{
			CountPeriodBatches: int64(batches), CountPeriodSubscribers: subs,
			CountPeriodInvoicesCreated: created, CountPeriodAlreadyInvoiced: already,
			CountRepaired: repaired,
		}
		if population != nil {
			counts[CountPopulation] = *population
		}
		out = append(out, owned.Completion[Request]{
			Params: Request{Period: p}, EventID: eventID, Owner: owner, Fence: fence, LockFence: lockFence, Finished: finished,
			Trigger: job.Trigger{Source: job.Source(source), RequestID: requestID, RequestedBy: requestedBy, Principal: principal},
			// The period's totals, as the original event carried them, with
			// what its completion repaired and counted; the run's own counts
			// were not kept.
			Counts: counts,
		})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("billrun: list unpublished completions: %w", err)
	}
	return out, nil
}
