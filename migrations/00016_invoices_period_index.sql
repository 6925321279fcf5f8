-- Where a period's invoices are (issue 23), for the anti-join that
-- reconciles a bill run before it is COMPLETED (its population against the
-- period's invoices), an adjustment run's unbilled subscribers and the
-- late-usage check. uidx_invoices_sub_period leads with the subscriber, so
-- without this every one of them read every period's invoices: O(all
-- invoices ever) instead of O(the period's).
--
-- A BRIN index, not a B-tree: a period's invoices are written together (its
-- bill run), so they sit in neighbouring heap pages, and a block-range
-- summary of period finds them for a few kilobytes per million rows and
-- next to nothing per insert (a second B-tree on invoices slowed a 1M bill
-- run by a fifth: BENCHMARKS.md). Block ranges not summarized yet (the
-- newest) are always read; autosummarize has autovacuum summarize each one
-- as it fills.
--
-- Building it reads the table once (about a second per million rows) while
-- writes to invoices wait. On a large table build it first without blocking:
--   create index concurrently if not exists invoices_period_brin on invoices using brin (period) with (pages_per_range = 32, autosummarize = on);
-- and this migration finds it there.

-- +goose Up
create index if not exists invoices_period_brin on invoices using brin (period) with (pages_per_range = 32, autosummarize = on);

-- +goose Down
drop index if exists invoices_period_brin;
