-- Rows that can never be right are refused where they enter (issue 23),
-- with the constraint's name in the error (SQLSTATE 23514 check_violation,
-- 23503 foreign_key_violation):
--   subscribers_deactivated_after_activated  deactivated_at >= activated_at
--       (either may be NULL). Before, a subscriber deactivated before it was
--       activated was billed for 0 days.
--   usage_charges_amount_non_negative  amount_cents >= 0. Usage is a charge;
--       a credit is not usage and has no table here (a negative "usage" of
--       -99,000 cents made a negative invoice).
--   usage_charges_subscriber_fk  usage_charges.subscriber_id references
--       subscribers (id): usage of an unknown subscriber is refused (it was
--       never billed and never reported). A subscriber with usage cannot be
--       deleted (NO ACTION): its usage is billing evidence.
--
-- Rows already present that break a rule stop this migration, naming the
-- rule, how many rows and the first ids, before anything is changed (the
-- migration is one transaction): correct or remove them
-- (docs/runbook.md#bad-data-refused-where-it-enters) and migrate again.
-- The constraints are then validated by one scan of each table, in this
-- one transaction, which holds subscribers and usage_charges ACCESS
-- EXCLUSIVE (reads wait too) until it commits: 6.7 s with 1M subscribers
-- and 10M usage rows (docs/runbook.md#bad-data-refused-where-it-enters).

-- +goose Up
-- +goose StatementBegin
do $$
declare
    n   bigint;
    ids text;
begin
    select count(*), string_agg(id::text, ', ' order by id) filter (where rn <= 10)
      into n, ids
      from (select id, row_number() over (order by id) as rn from subscribers
            where deactivated_at < activated_at) x;
    if n > 0 then
        raise exception 'migration 00017, subscribers_deactivated_after_activated: % subscriber(s) have deactivated_at before activated_at (ids %); correct them, then migrate again (docs/runbook.md#bad-data-refused-where-it-enters)', n, ids
            using errcode = 'check_violation', constraint = 'subscribers_deactivated_after_activated';
    end if;

    select count(*), string_agg(id::text, ', ' order by id) filter (where rn <= 10)
      into n, ids
      from (select id, row_number() over (order by id) as rn from usage_charges
            where amount_cents < 0) x;
    if n > 0 then
        raise exception 'migration 00017, usage_charges_amount_non_negative: % usage_charges row(s) have a negative amount_cents (ids %); usage is never negative: remove or correct them, then migrate again (docs/runbook.md#bad-data-refused-where-it-enters)', n, ids
            using errcode = 'check_violation', constraint = 'usage_charges_amount_non_negative';
    end if;

    select count(*), string_agg(id::text, ', ' order by id) filter (where rn <= 10)
      into n, ids
      from (select u.id, row_number() over (order by u.id) as rn from usage_charges u
            where not exists (select from subscribers s where s.id = u.subscriber_id)) x;
    if n > 0 then
        raise exception 'migration 00017, usage_charges_subscriber_fk: % usage_charges row(s) belong to no subscriber (ids %); load their subscribers or remove them, then migrate again (docs/runbook.md#bad-data-refused-where-it-enters)', n, ids
            using errcode = 'foreign_key_violation', constraint = 'usage_charges_subscriber_fk';
    end if;
end
$$;
-- +goose StatementEnd

alter table subscribers
    add constraint subscribers_deactivated_after_activated check (deactivated_at >= activated_at);
alter table usage_charges
    add constraint usage_charges_amount_non_negative check (amount_cents >= 0),
    add constraint usage_charges_subscriber_fk foreign key (subscriber_id) references subscribers (id);

-- +goose Down
alter table usage_charges
    drop constraint usage_charges_subscriber_fk,
    drop constraint usage_charges_amount_non_negative;
alter table subscribers drop constraint subscribers_deactivated_after_activated;
