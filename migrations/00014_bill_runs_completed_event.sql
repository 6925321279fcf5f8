-- When Kafka acknowledged a bill run's run.completed (RELIABILITY.md row 9).
-- NULL on a COMPLETED row: the event may have been lost with its replica's
-- in-memory buffer (SIGKILL, a buffer overflow in a long Kafka outage), so
-- every replica's resumer re-publishes it, with the same event id, once the
-- row has been finished for a grace period. The rows COMPLETED before this
-- migration are taken as published (their events went out, or were lost
-- long ago): an upgrade must not re-publish the whole history.

-- +goose Up
alter table bill_runs add column completed_event_at timestamptz;
update bill_runs set completed_event_at = coalesce(finished_at, now()) where status = 'COMPLETED';
-- The resumer's scan: COMPLETED rows not yet acknowledged (few, and short-lived).
create index bill_runs_completed_event_pending on bill_runs (finished_at)
    where status = 'COMPLETED' and completed_event_at is null;

-- +goose Down
drop index if exists bill_runs_completed_event_pending;
alter table bill_runs drop column if exists completed_event_at;
