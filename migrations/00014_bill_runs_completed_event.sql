-- A bill run's run.completed, tracked until Kafka acknowledged it
-- (RELIABILITY.md row 9). The run that completes the row stores the id of
-- its run.completed (completion_event_id, random per run); completed_event_at
-- is set once Kafka acknowledged that event. A COMPLETED row with an id and
-- no acknowledgement may have lost its event with its replica's in-memory
-- buffer (SIGKILL, a buffer overflow in a long Kafka outage), so every
-- replica's resumer re-publishes it, with the stored id, once the row has
-- been finished for a grace period. Rows completed without an id (before
-- this migration, or by a replica of an older version during a rolling
-- upgrade) are never re-published: their event went out with an id nobody
-- kept, and a second id for one completion would look like a second one.

-- +goose Up
alter table bill_runs add column completion_event_id text;
alter table bill_runs add column completed_event_at timestamptz;
update bill_runs set completed_event_at = coalesce(finished_at, now()) where status = 'COMPLETED';
-- The resumer's scan: COMPLETED rows whose event is not acknowledged yet (few, and short-lived).
create index bill_runs_completed_event_pending on bill_runs (finished_at)
    where status = 'COMPLETED' and completed_event_at is null and completion_event_id is not null;

-- +goose Down
drop index if exists bill_runs_completed_event_pending;
alter table bill_runs drop column if exists completed_event_at;
alter table bill_runs drop column if exists completion_event_id;
