package owned

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/telco-platform/coordinator/internal/job"
)

// The run_requests table (migrations/00009_run_requests.sql) holds, per
// kind and lock key, the accepted requests the coordinator still owes a
// completed run: what the resumer works from. Only resumable kinds (Worker.Incomplete)
// have rows. The template writes them at a run's end (requests
// below), the resumer adopts the incomplete runs its kinds list and books
// its attempts (resumer.go).

// sqlRequestDefer records an accepted request that did not complete: a new
// request starts over (attempts 0, due now, not permanent); accepted_at
// keeps the first acceptance. $9 true records a permanent failure instead
// (the resumer leaves it alone; it pages).
//
// $1 job, $2 lock key, $3 fields (JSON), $4 record key, $5 request_id,
// $6 requested_by, $7 trigger source, $8 outcome, $9 permanent, $10 error.
const sqlRequestDefer = `
insert into run_requests as q (job, run_key, fields, record_key, request_id, requested_by, trigger_source,
                               last_outcome, permanent, last_error)
values ($1, $2, $3, nullif($4, ''), nullif($5, ''), nullif($6, ''), nullif($7, ''), $8, $9, nullif($10, ''))
on conflict (job, run_key) do update
set fields          = excluded.fields,
    record_key      = excluded.record_key,
    request_id      = excluded.request_id,
    requested_by    = excluded.requested_by,
    trigger_source  = excluded.trigger_source,
    last_outcome    = excluded.last_outcome,
    last_error      = excluded.last_error,
    permanent       = excluded.permanent,
    attempts        = 0,
    next_attempt_at = clock_timestamp(),
    updated_at      = clock_timestamp()`

// sqlRequestAdopt records an incomplete run a kind listed, unless its
// request is recorded already (whatever its state).
//
// $1 job, $2 lock key, $3 fields, $4 record key, $5 request_id,
// $6 requested_by, $7 trigger source, $8 accepted at, $9 state.
const sqlRequestAdopt = `
insert into run_requests (job, run_key, fields, record_key, request_id, requested_by, trigger_source,
                          accepted_at, last_outcome)
values ($1, $2, $3, nullif($4, ''), nullif($5, ''), nullif($6, ''), nullif($7, ''), coalesce($8, clock_timestamp()), $9)
on conflict (job, run_key) do nothing`

// sqlRequestDone forgets a request whose run completed.
//
// $1 job, $2 lock key.
const sqlRequestDone = `delete from run_requests where job = $1 and run_key = $2`

// sqlRequestList lists a kind's requests with their age and whether an
// attempt is due, by the database's clock.
//
// $1 job.
const sqlRequestList = `
select run_key, fields, coalesce(record_key, ''), coalesce(request_id, ''), coalesce(requested_by, ''),
       coalesce(trigger_source, ''), attempts, permanent,
       extract(epoch from clock_timestamp() - accepted_at)::float8,
       next_attempt_at <= clock_timestamp()
from run_requests
where job = $1
order by accepted_at`

// sqlRequestAttempted books one resume attempt that did not complete the
// run: $3 counts it (lost, a retryable failure) or not (the lock was owned
// or unavailable: the run did not start); next try after $4 seconds; the
// $5th counted attempt makes the request permanent. Returns whether it is.
//
// $1 job, $2 lock key, $3 count, $4 delay seconds, $5 max attempts,
// $6 outcome, $7 error.
const sqlRequestAttempted = `
update run_requests
set attempts        = attempts + case when $3 then 1 else 0 end,
    next_attempt_at = clock_timestamp() + make_interval(secs => $4),
    permanent       = attempts + case when $3 then 1 else 0 end >= $5,
    last_outcome    = $6,
    last_error      = coalesce(nullif($7, ''), last_error),
    updated_at      = clock_timestamp()
where job = $1 and run_key = $2
returning permanent`

// sqlRequestGiveUp makes a request permanent (its stored fields no longer
// decode).
//
// $1 job, $2 lock key, $3 error.
const sqlRequestGiveUp = `
update run_requests set permanent = true, last_outcome = 'failed', last_error = $3, updated_at = clock_timestamp()
where job = $1 and run_key = $2`

// requestTimeout bounds one statement on run_requests.
const requestTimeout = 5 * time.Second

// request is one row of run_requests.
type request struct {
	job, key    string
	fields      map[string]json.RawMessage
	recordKey   string
	trigger     job.Trigger
	attempts    int
	permanent   bool
	ageSeconds  float64
	due         bool
	acceptedAt  *time.Time // adopt only
	lastOutcome string
}

// requests is the Postgres side of run_requests. A nil *requests records
// nothing (a Runner without a database).
type requests struct {
	pool *pgxpool.Pool
}

// encode is the request of a run of k with p, as Kind.Encode gives it.
func encodeRequest(k Kind, p Params, t job.Trigger) (request, error) {
	key, fields, err := k.Encode(p)
	if err != nil {
		return request{}, err
	}
	raw := make(map[string]json.RawMessage, len(fields))
	for name, v := range fields {
		b, err := json.Marshal(v)
		if err != nil {
			return request{}, fmt.Errorf("owned: encode request field %q: %w", name, err)
		}
		raw[name] = b
	}
	return request{job: k.Spec().Name, key: k.LockKey(p), fields: raw, recordKey: string(key), trigger: t}, nil
}

// decode is the request's Params, through the kind's Decode.
func (q request) decode(k Kind) (Params, error) {
	return k.Decode(NewInput(job.SourceResume, []byte(q.recordKey), q.fields, false))
}

// record writes q as an accepted request not completed (permanent: failed
// for good), with the outcome and error that ended its run.
func (s *requests) record(ctx context.Context, q request, outcome job.Outcome, permanent bool, errText string) error {
	fields, err := json.Marshal(q.fields)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, sqlRequestDefer, q.job, q.key, fields, q.recordKey, q.trigger.RequestID,
		q.trigger.RequestedBy, string(q.trigger.Source), string(outcome), permanent, errText)
	if err != nil {
		return fmt.Errorf("owned: record request %s: %w", q.key, err)
	}
	return nil
}

// adopt records an incomplete run a kind listed, unless already recorded.
func (s *requests) adopt(ctx context.Context, q request) error {
	fields, err := json.Marshal(q.fields)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, sqlRequestAdopt, q.job, q.key, fields, q.recordKey, q.trigger.RequestID,
		q.trigger.RequestedBy, string(q.trigger.Source), q.acceptedAt, q.lastOutcome)
	if err != nil {
		return fmt.Errorf("owned: adopt request %s: %w", q.key, err)
	}
	return nil
}

// done forgets the request of a completed run.
func (s *requests) done(ctx context.Context, jobName, key string) error {
	if _, err := s.pool.Exec(ctx, sqlRequestDone, jobName, key); err != nil {
		return fmt.Errorf("owned: forget request %s: %w", key, err)
	}
	return nil
}

// list returns the kind's requests, oldest first.
func (s *requests) list(ctx context.Context, jobName string) ([]request, error) {
	rows, err := s.pool.Query(ctx, sqlRequestList, jobName)
	if err != nil {
		return nil, fmt.Errorf("owned: list requests of %s: %w", jobName, err)
	}
	defer rows.Close()
	var out []request
	for rows.Next() {
		q := request{job: jobName}
		var fields []byte
		var source string
		if err := rows.Scan(&q.key, &fields, &q.recordKey, &q.trigger.RequestID, &q.trigger.RequestedBy, &source,
			&q.attempts, &q.permanent, &q.ageSeconds, &q.due); err != nil {
			return nil, fmt.Errorf("owned: list requests of %s: %w", jobName, err)
		}
		q.trigger.Source = job.Source(source)
		if err := json.Unmarshal(fields, &q.fields); err != nil {
			q.fields = nil // decode fails and gives the request up
		}
		out = append(out, q)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("owned: list requests of %s: %w", jobName, err)
	}
	return out, nil
}

// attempted books a resume attempt that did not complete the run; it
// reports whether the request is now permanent (its attempts spent).
func (s *requests) attempted(ctx context.Context, q request, count bool, delay time.Duration, maxAttempts int,
	outcome job.Outcome, errText string) (bool, error) {
	var permanent bool
	err := s.pool.QueryRow(ctx, sqlRequestAttempted, q.job, q.key, count, delay.Seconds(), maxAttempts,
		string(outcome), errText).Scan(&permanent)
	if err != nil {
		return false, fmt.Errorf("owned: book attempt of %s: %w", q.key, err)
	}
	return permanent, nil
}

// giveUp makes q permanent with errText.
func (s *requests) giveUp(ctx context.Context, q request, errText string) error {
	if _, err := s.pool.Exec(ctx, sqlRequestGiveUp, q.job, q.key, errText); err != nil {
		return fmt.Errorf("owned: give up request %s: %w", q.key, err)
	}
	return nil
}
