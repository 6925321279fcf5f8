-- A trigger for a COMPLETED period is answered without the lock and without
-- reading the period's invoices (issue 28): what is late (usage no invoice or
-- adjustment covers, subscribers of the period with no invoice) is kept per
-- period as of a snapshot, and what changed since that snapshot is found
-- through indexes on the writing transaction's id (internal/billrun/late.go).
--
--   subscribers.changed_xid, usage_charges.changed_xid
--       the id of the transaction that last inserted or updated the row
--       (pg_current_xact_id(), set by default and by coordinator_changed_xid
--       on every insert or update whatever the writer says). NULL on rows
--       written before this migration: older than any snapshot kept.
--   bill_run_changes
--       (period, subscriber) pairs whose late usage or invoice changed in a
--       way the columns above cannot show: a usage charge deleted or moved to
--       another subscriber or period, an invoice of a period written by
--       anything but its bill run's batches (an adjustment run, another
--       writer, an edit by hand) or updated or deleted, and every
--       invoice_adjustments row written. One row per change, with the
--       writer's transaction id. Rows are never needed once every kept
--       snapshot is newer; `truncate bill_run_changes` (which empties
--       bill_run_late too, so every period is checked in full once more) is
--       the way to reclaim them; deleting some of them empties bill_run_late
--       as well (a trigger), never leaving a kept check blind.
--   bill_run_late
--       per period: the snapshot (pg_snapshot) it was last checked at, the
--       subscribers late or unbilled then (ids), and the bill run's claim
--       fence it belongs to (bill_fence; NULL: only the base a completion
--       starts from, recorded at the run's first claim when the period had
--       no invoice and no adjustment yet). system_id is the cluster's
--       (pg_control_system()): a snapshot means nothing in another cluster
--       (a restore from a dump), so it is not used there. A bill_runs row
--       deleted or truncated takes its row along (trigger); so does a
--       TRUNCATE of any table the check reads.
--
-- Building the indexes reads subscribers and usage_charges once while writes
-- to them wait. On large tables build them first without blocking:
--   create index concurrently if not exists subscribers_changed_xid on subscribers (changed_xid);
--   create index concurrently if not exists usage_charges_period_changed on usage_charges (period, changed_xid);
-- and this migration finds them there. Adding the columns rewrites nothing.

-- +goose Up
alter table subscribers add column changed_xid xid8;
alter table subscribers alter column changed_xid set default pg_current_xact_id();
alter table usage_charges add column changed_xid xid8;
alter table usage_charges alter column changed_xid set default pg_current_xact_id();
create index if not exists subscribers_changed_xid on subscribers (changed_xid);
create index if not exists usage_charges_period_changed on usage_charges (period, changed_xid);

-- +goose StatementBegin
create function coordinator_changed_xid() returns trigger language plpgsql as $$
begin
    new.changed_xid := pg_current_xact_id();
    return new;
end
$$;
-- +goose StatementEnd
-- WHEN keeps the function out of an ordinary insert (the default already
-- holds the writer's id): it runs on updates and on inserts that bring a
-- value of their own (a copy from another database).
create trigger subscribers_changed_xid before insert or update on subscribers
    for each row when (new.changed_xid is distinct from pg_current_xact_id()) execute function coordinator_changed_xid();
create trigger usage_charges_changed_xid before insert or update on usage_charges
    for each row when (new.changed_xid is distinct from pg_current_xact_id()) execute function coordinator_changed_xid();

create table bill_run_changes (
    period        text   not null,
    subscriber_id bigint not null,
    changed_xid   xid8   not null default pg_current_xact_id()
);
create index bill_run_changes_period_changed on bill_run_changes (period, changed_xid);

-- A kept row's version is never reused (a row forgotten and made again
-- takes a new one): a check's write-back that read an older row never lands
-- on a newer one.
create sequence bill_run_late_version;
create table bill_run_late (
    period     text primary key,
    bill_fence bigint,
    snap       pg_snapshot not null,
    ids        bigint[] not null default '{}',
    system_id  bigint not null,
    version    bigint not null default nextval('bill_run_late_version'),
    checked_at timestamptz not null default clock_timestamp()
);

-- +goose StatementBegin
create function coordinator_log_change() returns trigger language plpgsql as $$
begin
    if tg_op in ('UPDATE', 'DELETE') then
        insert into bill_run_changes (period, subscriber_id) values (old.period, old.subscriber_id);
    end if;
    if tg_op in ('INSERT', 'UPDATE') then
        insert into bill_run_changes (period, subscriber_id) values (new.period, new.subscriber_id);
    end if;
    return null;
end
$$;
create function coordinator_log_usage_moved() returns trigger language plpgsql as $$
begin
    insert into bill_run_changes (period, subscriber_id) values (old.period, old.subscriber_id);
    return null;
end
$$;
create function coordinator_forget_late() returns trigger language plpgsql as $$
begin
    if tg_level = 'STATEMENT' then
        delete from bill_run_late;
    else
        delete from bill_run_late where period = old.period;
    end if;
    return null;
end
$$;
-- +goose StatementEnd

-- A usage charge inserted or updated shows in its changed_xid; one deleted,
-- or moved off its (subscriber, period), leaves a row behind.
create trigger usage_charges_deleted after delete on usage_charges
    for each row execute function coordinator_log_usage_moved();
create trigger usage_charges_moved after update of subscriber_id, period on usage_charges
    for each row when ((old.subscriber_id, old.period) is distinct from (new.subscriber_id, new.period))
    execute function coordinator_log_usage_moved();
-- A bill run's own batches (bill_run_fence set) are not logged: they write
-- only while the row is not COMPLETED, and a completion proves what they
-- wrote.
create trigger invoices_written after insert on invoices
    for each row when (new.bill_run_fence is null) execute function coordinator_log_change();
create trigger invoices_changed after update or delete on invoices
    for each row execute function coordinator_log_change();
create trigger invoice_adjustments_written after insert or update or delete on invoice_adjustments
    for each row execute function coordinator_log_change();

create trigger bill_runs_forget_late after delete on bill_runs
    for each row execute function coordinator_forget_late();
create trigger bill_runs_truncated after truncate on bill_runs
    for each statement execute function coordinator_forget_late();
create trigger subscribers_truncated after truncate on subscribers
    for each statement execute function coordinator_forget_late();
create trigger usage_charges_truncated after truncate on usage_charges
    for each statement execute function coordinator_forget_late();
create trigger invoices_truncated after truncate on invoices
    for each statement execute function coordinator_forget_late();
create trigger invoice_adjustments_truncated after truncate on invoice_adjustments
    for each statement execute function coordinator_forget_late();
create trigger bill_run_changes_truncated after truncate on bill_run_changes
    for each statement execute function coordinator_forget_late();
-- Rows deleted or edited (a clean-up by hand) would hide the changes they
-- record from every kept check: the kept checks go with them, as with a
-- truncate.
create trigger bill_run_changes_pruned after delete or update on bill_run_changes
    for each statement execute function coordinator_forget_late();

-- Every trigger above fires whatever session_replication_role says: a
-- logical replication subscriber, or a bulk load that sets replica to skip
-- foreign keys, fires no ordinary trigger, and a change it wrote unseen
-- would be missing from every kept check.
alter table subscribers enable always trigger subscribers_changed_xid;
alter table subscribers enable always trigger subscribers_truncated;
alter table usage_charges enable always trigger usage_charges_changed_xid;
alter table usage_charges enable always trigger usage_charges_deleted;
alter table usage_charges enable always trigger usage_charges_moved;
alter table usage_charges enable always trigger usage_charges_truncated;
alter table invoices enable always trigger invoices_written;
alter table invoices enable always trigger invoices_changed;
alter table invoices enable always trigger invoices_truncated;
alter table invoice_adjustments enable always trigger invoice_adjustments_written;
alter table invoice_adjustments enable always trigger invoice_adjustments_truncated;
alter table bill_runs enable always trigger bill_runs_forget_late;
alter table bill_runs enable always trigger bill_runs_truncated;
alter table bill_run_changes enable always trigger bill_run_changes_truncated;
alter table bill_run_changes enable always trigger bill_run_changes_pruned;

-- +goose Down
drop table bill_run_late;
drop sequence bill_run_late_version;
drop table bill_run_changes;
drop trigger invoice_adjustments_truncated on invoice_adjustments;
drop trigger invoices_truncated on invoices;
drop trigger usage_charges_truncated on usage_charges;
drop trigger subscribers_truncated on subscribers;
drop trigger bill_runs_truncated on bill_runs;
drop trigger bill_runs_forget_late on bill_runs;
drop trigger invoice_adjustments_written on invoice_adjustments;
drop trigger invoices_changed on invoices;
drop trigger invoices_written on invoices;
drop trigger usage_charges_moved on usage_charges;
drop trigger usage_charges_deleted on usage_charges;
drop trigger usage_charges_changed_xid on usage_charges;
drop trigger subscribers_changed_xid on subscribers;
drop function coordinator_forget_late();
drop function coordinator_log_usage_moved();
drop function coordinator_log_change();
drop function coordinator_changed_xid();
drop index if exists usage_charges_period_changed;
drop index if exists subscribers_changed_xid;
alter table usage_charges drop column changed_xid;
alter table subscribers drop column changed_xid;
