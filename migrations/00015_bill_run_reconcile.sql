-- What a bill run's completion proved (issue 23). Before a run is
-- COMPLETED it reconciles, under its fence, the period's invoices with its
-- population at the cutoff, and bills the members that have none (a
-- Postgres that lost acknowledged commits, a failover to an asynchronous
-- replica). The COMPLETED update records:
--   repaired    subscribers the reconcile billed (0: none were missing);
--               counted in subscribers and invoices_created too
--   population  the population at the cutoff, counted by the reconcile
--               (NULL until COMPLETED, and on rows completed before this
--               migration)
-- An adjustment run also bills the period's subscribers that have no
-- invoice (loaded, or backdated into the period, after its bill run):
--   invoices.adjust_fence  the adjustment claim (bill_run_adjustments.fence)
--               that wrote the invoice; NULL for every other writer
--   bill_run_adjustments.invoices_created  how many every adjustment run
--               of the period wrote

-- +goose Up
alter table bill_runs
    add column repaired   bigint not null default 0,
    add column population bigint;
alter table invoices add column adjust_fence bigint;
alter table bill_run_adjustments add column invoices_created bigint not null default 0;

-- +goose Down
alter table bill_run_adjustments drop column invoices_created;
alter table invoices drop column adjust_fence;
alter table bill_runs
    drop column population,
    drop column repaired;
