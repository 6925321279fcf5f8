-- The floor of a bill run (internal/billrun/bench_test.go,
-- bench/billrun-rss): the same invoices as a bill run (the period's
-- population at its cutoff, fees prorated by active days in the billing
-- zone, usage added and recorded) from one INSERT ... SELECT ... ON CONFLICT
-- DO NOTHING, with no fence, no batches and no record.
--
-- $1 period, $2 period start, $3 period end, $4 cutoff, $5 billing zone,
-- $6 days in the period.
insert into invoices (subscriber_id, period, amount_cents, usage_cents, bill_run_fence)
select s.id, $1,
       round(s.monthly_fee_cents::numeric * greatest(
           case when s.deactivated_at is null or s.deactivated_at >= $3 then $6::int
                else extract(day from (s.deactivated_at - interval '1 microsecond') at time zone $5)::int end
         - case when s.activated_at is null or s.activated_at <= $2 then 1
                else extract(day from s.activated_at at time zone $5)::int end + 1, 0) / $6::int)::bigint
         + coalesce(u.total, 0),
       coalesce(u.total, 0), 0
from subscribers s
left join (select subscriber_id, sum(amount_cents) as total
           from usage_charges where period = $1 group by subscriber_id) u on u.subscriber_id = s.id
where s.created_at <= $4
  and (s.activated_at is null or s.activated_at < $3)
  and (s.deactivated_at is null or s.deactivated_at > $2)
  and (s.status = 'ACTIVE' or s.deactivated_at is not null)
on conflict (subscriber_id, period) do nothing
