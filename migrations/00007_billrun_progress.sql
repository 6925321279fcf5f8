-- Bill-run progress (issue 17): the denominator of GET /v1/billruns/{period}'s
-- progress. A run writes its estimate (committed batches plus the ACTIVE
-- subscribers left to plan, in batches) as it starts, the exact count once its
-- plan is complete, and the committed count when it completes. NULL: not
-- known yet (a row from before this migration, or a run that has just
-- claimed).

-- +goose Up
alter table bill_runs add column batches_total integer;

-- +goose Down
alter table bill_runs drop column batches_total;
