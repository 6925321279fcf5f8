-- The running total of a bill run's progress, beside bill_runs (issue 18).
-- It was bill_runs.batches_total, written with an UPDATE of the run's row;
-- every batch in flight holds that row FOR SHARE (its fence check), and
-- with several workers one nearly always does, so the UPDATE waited for
-- most of the run and gave up. An upsert here only takes FOR KEY SHARE on
-- bill_runs (the foreign key), which no batch and no claim conflicts with.
-- A row holds the total of one claim (fence); bill_runs.batches_total keeps
-- the committed count once a run is COMPLETED.

-- +goose Up
create table bill_run_totals (
    period        text    primary key references bill_runs (period) on delete cascade,
    fence         bigint  not null,
    batches_total integer not null
);

-- +goose Down
drop table bill_run_totals;
