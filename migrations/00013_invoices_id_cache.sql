-- Invoice ids from a per-session cache of 1000 (issue 18). A bill run's
-- workers insert invoices concurrently; with no cache every row's nextval
-- locked the one sequence page, and every row's id went to the same
-- rightmost invoices_pkey page. With a cache each session takes ids in
-- blocks of 1000: no lock per row, and each worker fills its own leaf pages.
-- Ids stay unique; they are no longer in commit order across sessions, and
-- a session that ends leaves the rest of its block unused (gaps, as a
-- rolled-back insert always could).

-- +goose Up
alter table invoices alter column id set cache 1000;

-- +goose Down
alter table invoices alter column id set cache 1;
