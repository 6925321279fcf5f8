-- MSISDN pool (FR-13): FREE -> RESERVED -> ALLOCATED. The reaper frees
-- RESERVED rows whose reserved_until has passed.

-- +goose Up
create table msisdn_pool (
    msisdn         text primary key,
    state          text not null default 'FREE' check (state in ('FREE', 'RESERVED', 'ALLOCATED')),
    reserved_until timestamptz,
    reserved_by    text,
    subscriber_id  bigint,
    updated_at     timestamptz not null default now(),
    check (state <> 'RESERVED' or reserved_until is not null)
);
-- The sweep walks RESERVED rows in msisdn order from a cursor, so each batch
-- starts where the last one ended instead of stepping again over the rows
-- (and dead index entries) of every batch before it. Rows leaving RESERVED
-- are not inserted into these partial indexes, so freeing costs them nothing.
create index msisdn_pool_reserved on msisdn_pool (msisdn) where state = 'RESERVED';
-- Stale reservations by expiry (monitoring, the single-statement baseline).
create index msisdn_pool_stale_reservations on msisdn_pool (reserved_until) where state = 'RESERVED';
-- Reserve takes the next FREE number.
create index msisdn_pool_free on msisdn_pool (msisdn) where state = 'FREE';

-- +goose Down
drop table msisdn_pool;
