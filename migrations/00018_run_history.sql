-- The console's run history (issue 26): one row per owned run that held its
-- lock, of every kind, written once at the run's outcome by the template
-- (owned.RunHistory). bill_runs keeps one row per period and the reaper
-- and replenishment keep none; this is the one place that says who ran
-- what, when, for how long and how it ended. Rows older than
-- COORDINATOR_CONSOLE_RETENTION are deleted (internal/history).
--   job, run_key          the kind and the lock key (billrun:2026-11)
--   outcome               completed, already_completed, lost, failed
--   replica               the owner: the replica that held the lock
--   fence, lock_fence     the claim's fence (else the lock's) and the lock's
--   trigger_source, request_id, requested_by, principal   who asked, how
--   started_at, ended_at  lock taken, outcome fixed
--   counts                the kind's counts (invoices_created, repaired, freed, ...)
--   timeline              progress over time: [[ms, batches, rows], ...], at most 240 points
-- Pages are read newest first by id (keyset pagination), per job and per
-- job and key.

-- +goose Up
create table run_history (
    id             bigint generated always as identity primary key,
    job            text        not null,
    run_key        text        not null,
    outcome        text        not null,
    replica        text        not null,
    fence          bigint,
    lock_fence     bigint,
    trigger_source text,
    request_id     text,
    requested_by   text,
    principal      text,
    started_at     timestamptz not null,
    ended_at       timestamptz not null,
    counts         jsonb       not null default '{}',
    error          text,
    timeline       jsonb       not null default '[]'
);
create index run_history_job_id on run_history (job, id desc);
create index run_history_job_key_id on run_history (job, run_key, id desc);
create index run_history_ended_at on run_history (ended_at);

-- +goose Down
drop table run_history;
