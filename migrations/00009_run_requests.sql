-- Accepted run requests the coordinator still owes a completed run (issue
-- 13): one row per kind (job) and lock key, for the kinds with a resumer
-- (bill runs). A run that did not complete (lost, a retryable failure, an
-- already_owned answer whose holder may die, a cron tick that met Redis
-- down) is recorded here before its Kafka trigger is committed; the resumer
-- of every replica retries the due rows through the owned template and the
-- row goes when the run completes. permanent: failed for good, or its
-- attempts spent; it pages and waits for a person (docs/runbook.md).
--   fields, record_key  the request as the kind encodes it (Kind.Encode)
--   request_id, requested_by, trigger_source  the request's trigger
--   accepted_at         first accepted (the age the alert watches)
--   attempts            resume attempts that ran and did not complete
--   next_attempt_at     when the resumer may try again (backoff)
--   last_outcome, last_error  how the latest run or attempt ended

-- +goose Up
create table run_requests (
    job             text        not null,
    run_key         text        not null,
    fields          jsonb       not null default '{}',
    record_key      text,
    request_id      text,
    requested_by    text,
    trigger_source  text,
    accepted_at     timestamptz not null default clock_timestamp(),
    updated_at      timestamptz not null default clock_timestamp(),
    attempts        integer     not null default 0,
    next_attempt_at timestamptz not null default clock_timestamp(),
    permanent       boolean     not null default false,
    last_outcome    text,
    last_error      text,
    primary key (job, run_key)
);

-- +goose Down
drop table run_requests;
