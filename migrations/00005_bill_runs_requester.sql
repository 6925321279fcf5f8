-- Who asked for a bill run (issue 16): the latest claim's trigger, so that
-- bill_runs answers "who started this?" without the event log. Nullable:
-- rows written before this migration, and other writers, leave them empty.
--   requested_by   who asked, as the trigger says (HTTP body or token name,
--                  Kafka record, the replica for cron, the OS user for the CLI)
--   principal      who was authenticated: the admin token's name (HTTP only)
--   request_id     the trigger's request id (correlates with the events)
--   trigger_source kafka, cron, http or cli

-- +goose Up
alter table bill_runs
    add column requested_by   text,
    add column principal      text,
    add column request_id     text,
    add column trigger_source text;

-- +goose Down
alter table bill_runs
    drop column trigger_source,
    drop column request_id,
    drop column principal,
    drop column requested_by;
