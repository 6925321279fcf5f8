-- The reaper's walk by expiry (issue 18). A sweep walked every RESERVED row in
-- msisdn order (msisdn_pool_reserved) and read each row's heap tuple to test
-- reserved_until: a tick cost O(reserved) even when nothing was stale. When
-- few reservations are stale, a sweep now walks this index from the oldest
-- hold with a (reserved_until, msisdn) cursor and stops at the first hold
-- that is still valid: it reads only the stale rows' index entries and heap
-- tuples, O(stale), whatever the visibility map says. When most are stale it
-- still walks msisdn_pool_reserved, whose batches of neighbouring rows dirty
-- far fewer pages (bench/notes/reaper.md).
--
-- It supersedes msisdn_pool_stale_reservations (reserved_until alone): its
-- leading column serves the stale count and the single-statement baseline.
-- So Reserve still maintains two partial indexes on RESERVED rows.
--
-- CREATE INDEX blocks writes to msisdn_pool while it builds (about a second
-- per million RESERVED rows; only RESERVED rows are indexed).

-- +goose Up
create index msisdn_pool_reserved_expiry on msisdn_pool (reserved_until, msisdn) where state = 'RESERVED';
drop index msisdn_pool_stale_reservations;

-- +goose Down
create index msisdn_pool_stale_reservations on msisdn_pool (reserved_until) where state = 'RESERVED';
drop index msisdn_pool_reserved_expiry;
