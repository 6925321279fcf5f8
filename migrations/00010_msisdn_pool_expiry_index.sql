-- The reaper's walk by expiry (issue 18). The sweep used to walk every
-- RESERVED row in msisdn order (msisdn_pool_reserved) and read each row's
-- heap tuple to test reserved_until: a tick cost O(reserved) even when
-- nothing was stale. It now walks this index from the oldest hold, with a
-- (reserved_until, msisdn) cursor, and stops at the first hold that is still
-- valid: a tick reads only the stale rows' index entries and heap tuples,
-- O(stale), whatever the visibility map says (see bench/notes/reaper.md).
--
-- It supersedes both partial indexes on RESERVED rows: msisdn_pool_reserved
-- (the old msisdn walk; Allocate and Release go through the primary key) and
-- msisdn_pool_stale_reservations (reserved_until alone: the leading column of
-- this one serves the stale count and the single-statement baseline).
--
-- CREATE INDEX blocks writes to msisdn_pool while it builds (about a second
-- per million RESERVED rows; only RESERVED rows are indexed).

-- +goose Up
create index msisdn_pool_reserved_expiry on msisdn_pool (reserved_until, msisdn) where state = 'RESERVED';
drop index msisdn_pool_reserved;
drop index msisdn_pool_stale_reservations;

-- +goose Down
create index msisdn_pool_reserved on msisdn_pool (msisdn) where state = 'RESERVED';
create index msisdn_pool_stale_reservations on msisdn_pool (reserved_until) where state = 'RESERVED';
drop index msisdn_pool_reserved_expiry;
