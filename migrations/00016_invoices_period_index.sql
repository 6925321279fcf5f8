-- The period's invoices in subscriber order (issue 23), for the anti-join
-- that reconciles a bill run before it is COMPLETED (the population against
-- its invoices), the adjustment run's unbilled subscribers and late usage.
-- uidx_invoices_sub_period leads with the subscriber, so reading one
-- period through it reads every period's entries: O(all invoices ever)
-- instead of O(the period's).
--
-- CREATE INDEX blocks writes to invoices while it builds (seconds per
-- million rows). On a large table, build it first without blocking:
--   create index concurrently if not exists invoices_period_subscriber on invoices (period, subscriber_id);
-- and this migration finds it there. (A concurrent build that failed leaves
-- an INVALID index of that name: drop it and build again.)

-- +goose Up
create index if not exists invoices_period_subscriber on invoices (period, subscriber_id);

-- +goose Down
drop index if exists invoices_period_subscriber;
