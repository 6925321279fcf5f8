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
-- The sweep's scan: only RESERVED rows, ordered by expiry.
create index msisdn_pool_stale_reservations on msisdn_pool (reserved_until) where state = 'RESERVED';
-- Reserve takes the next FREE number.
create index msisdn_pool_free on msisdn_pool (msisdn) where state = 'FREE';

-- +goose Down
drop table msisdn_pool;
