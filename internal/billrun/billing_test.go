package billrun_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// sub is one subscriber of a billing test.
type sub struct {
	id          int64
	status      string
	fee         int64
	activated   *time.Time
	deactivated *time.Time
	usage       int64 // the period's usage charges, cents
}

func at(t time.Time) *time.Time { return &t }

func (b *bundle) insertSubs(t *testing.T, p billrun.Period, subs []sub) {
	t.Helper()
	ctx := context.Background()
	for _, s := range subs {
		_, err := b.pool.Exec(ctx, `insert into subscribers (id, status, monthly_fee_cents, activated_at, deactivated_at) values ($1, $2, $3, $4, $5)`,
			s.id, s.status, s.fee, s.activated, s.deactivated)
		require.NoError(t, err)
		if s.usage != 0 {
			_, err := b.pool.Exec(ctx, `insert into usage_charges (subscriber_id, period, amount_cents) values ($1, $2, $3)`, s.id, p.String(), s.usage)
			require.NoError(t, err)
		}
	}
}

// wantInvoice is the contract's rule, computed day by day (independently of
// the SQL's first/last day): in the population when activated before the
// period's end and not deactivated by its start (nor by status alone); a day
// counts when the subscriber was active for any part of it; the fee is
// prorated to those days, rounded half up, plus the usage.
func wantInvoice(s sub, p billrun.Period, loc *time.Location) (int64, bool) {
	start, end := p.Start(loc), p.End(loc)
	if s.status != "ACTIVE" && s.deactivated == nil {
		return 0, false
	}
	if s.activated != nil && !s.activated.Before(end) || s.deactivated != nil && !s.deactivated.After(start) {
		return 0, false
	}
	days := int64(0)
	dim := int64(0)
	for d := time.Date(p.Year, p.Month, 1, 0, 0, 0, 0, loc); d.Month() == p.Month; d = d.AddDate(0, 0, 1) {
		dim++
		next := d.AddDate(0, 0, 1)
		if (s.activated == nil || s.activated.Before(next)) && (s.deactivated == nil || s.deactivated.After(d)) {
			days++
		}
	}
	return (2*s.fee*days+dim)/(2*dim) + s.usage, true
}

// requireInvoices checks the period's invoices are exactly wantInvoice's.
func (b *bundle) requireInvoices(t *testing.T, p billrun.Period, loc *time.Location, subs []sub) {
	t.Helper()
	got := map[int64]int64{}
	rows, err := b.pool.Query(context.Background(), `select subscriber_id, amount_cents from invoices where period = $1`, p.String())
	require.NoError(t, err)
	for rows.Next() {
		var id, amount int64
		require.NoError(t, rows.Scan(&id, &amount))
		got[id] = amount
	}
	require.NoError(t, rows.Err())
	want := map[int64]int64{}
	for _, s := range subs {
		if amount, ok := wantInvoice(s, p, loc); ok {
			want[s.id] = amount
		}
	}
	require.Equal(t, want, got, "period %s in %s", p, loc)
}

// The population and the amounts of each rule, in UTC, over months of 28,
// 29, 30 and 31 days.
func TestPopulationAndProration(t *testing.T) {
	t.Parallel()
	for _, p := range []billrun.Period{{Year: 2026, Month: time.February}, {Year: 2024, Month: time.February},
		{Year: 2026, Month: time.November}, {Year: 2026, Month: time.October}} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			utc := time.UTC
			start, end, dim := p.Start(utc), p.End(utc), p.Days()
			day := func(d, h int) time.Time { return time.Date(p.Year, p.Month, d, h, 0, 0, 0, utc) }
			subs := []sub{
				{id: 1, status: "ACTIVE", fee: 1000, usage: 250},                                             // full month: exactly the fee
				{id: 2, status: "TERMINATED", fee: 1000, deactivated: at(day(dim, 15)), usage: 75},           // terminated on the last day, with usage
				{id: 3, status: "SUSPENDED", fee: 1000, deactivated: at(end.Add(10 * time.Hour))},            // suspended on the 1st of the next month
				{id: 4, status: "ACTIVE", fee: 1000, activated: at(end.Add(24 * time.Hour))},                 // signed up after the month ended
				{id: 5, status: "TERMINATED", fee: 1000},                                                     // deactivated by status only
				{id: 6, status: "ACTIVE", fee: 1000, activated: at(day(10, 12))},                             // from the 10th
				{id: 7, status: "TERMINATED", fee: 1000, deactivated: at(day(11, 0))},                        // midnight: the 11th does not count
				{id: 8, status: "TERMINATED", fee: 1000, deactivated: at(start.Add(-time.Hour))},             // before the period
				{id: 9, status: "ACTIVE", fee: 1000, activated: at(end)},                                     // at the end: not in it
				{id: 10, status: "ACTIVE", fee: 1000, activated: at(end.Add(-time.Microsecond))},             // the last instant: one day
				{id: 11, status: "TERMINATED", fee: 1000, deactivated: at(start.Add(time.Microsecond))},      // the first instant: one day
				{id: 12, status: "ACTIVE", fee: 3, activated: at(day(dim-4, 8))},                             // 5 days of 3 cents: rounding
				{id: 13, status: "ACTIVE", fee: 999, activated: at(day(2, 0)), deactivated: at(day(dim, 0))}, // days 2..dim-1
				{id: 14, status: "ACTIVE", fee: 1000, activated: at(start)},                                  // at the start: full month
				{id: 15, status: "SUSPENDED", fee: 0, deactivated: at(day(5, 1)), usage: 40},                 // no fee, usage only
			}
			b.insertSubs(t, p, subs)
			res := b.runner(billrun.Config{BatchSize: 4}).Run(context.Background(), p, trig())
			require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
			b.requireInvoices(t, p, utc, subs)

			// Spot checks of the rules the issue names, beside the reference.
			amount := func(id int64) int64 {
				return b.count(t, `select coalesce(max(amount_cents), -1) from invoices where period = $1 and subscriber_id = $2`, p.String(), id)
			}
			require.Equal(t, int64(1250), amount(1), "a full month bills exactly the fee")
			require.Equal(t, int64(1075), amount(2), "terminated on the last day: the full month and its usage")
			require.Equal(t, int64(1000), amount(3), "suspended on the 1st of the next month: the full month")
			require.Equal(t, int64(-1), amount(4), "signed up after the month: no invoice")
			require.Equal(t, int64(-1), amount(5))
			require.Equal(t, int64(10*1000+dim/2)/int64(dim), amount(7), "ten days")
			require.Equal(t, int64(1000), amount(14))
			require.Equal(t, int64(40), amount(15))
			require.Equal(t, int64(0), b.count(t, `select count(*) from invoices i where i.period = $1 and i.usage_cents is distinct from
				coalesce((select sum(u.amount_cents) from usage_charges u where u.subscriber_id = i.subscriber_id and u.period = $1), 0)`, p.String()),
				"every invoice records the usage it billed")
		})
	}
}

// Months begin and end at midnight in the billing zone, across DST changes:
// America/New_York's November begins in EDT and ends in EST, March begins
// in EST and ends in EDT.
func TestProrationInANonUTCZoneAcrossDST(t *testing.T) {
	t.Parallel()
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	for _, p := range []billrun.Period{{Year: 2026, Month: time.November}, {Year: 2026, Month: time.March}} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			start, end := p.Start(ny), p.End(ny)
			local := func(d, h, m int) time.Time { return time.Date(p.Year, p.Month, d, h, m, 0, 0, ny) }
			subs := []sub{
				{id: 1, status: "ACTIVE", fee: 3000},
				{id: 2, status: "TERMINATED", fee: 3000, deactivated: at(start.Add(30 * time.Minute))},   // half an hour of day 1
				{id: 3, status: "ACTIVE", fee: 3000, activated: at(start.Add(-time.Minute))},             // the day before, local
				{id: 4, status: "ACTIVE", fee: 3000, activated: at(end.Add(-time.Minute))},               // 23:59 local on the last day (the next day in UTC)
				{id: 5, status: "TERMINATED", fee: 3000, deactivated: at(end)},                           // at local midnight ending the month
				{id: 6, status: "TERMINATED", fee: 3000, deactivated: at(local(9, 0, 0))},                // local midnight of the 9th: 8 days
				{id: 7, status: "ACTIVE", fee: 3000, activated: at(local(1, 3, 0))},                      // 03:00 on the day the clocks change
				{id: 8, status: "TERMINATED", fee: 3000, deactivated: at(local(2, 0, 0)), usage: 10},     // the day after the change begins
				{id: 9, status: "TERMINATED", fee: 3000, deactivated: at(end.Add(-time.Hour)), usage: 5}, // 23:00 local on the last day
			}
			if p.Month == time.March {
				subs = append(subs, sub{id: 10, status: "ACTIVE", fee: 3100, activated: at(local(8, 3, 30))}) // 03:30 EDT on 8 March, after the skipped hour
			}
			b.insertSubs(t, p, subs)
			res := b.runner(billrun.Config{BatchSize: 3, Calendar: billrun.Calendar{Zone: ny}}).Run(context.Background(), p, trig())
			require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
			b.requireInvoices(t, p, ny, subs)
			require.Equal(t, int64(3000), b.count(t, `select amount_cents from invoices where period = $1 and subscriber_id = 1`, p.String()))
			dim := int64(p.Days())
			require.Equal(t, (2*3000+dim)/(2*dim), b.count(t, `select amount_cents from invoices where period = $1 and subscriber_id = 4`, p.String()),
				"one day: 23:59 local on the last day")
			require.Equal(t, "America/New_York", b.text(t, `select billing_tz from bill_runs where period = $1`, p.String()))
			st, err := billrun.ReadStatus(context.Background(), b.pool, p)
			require.NoError(t, err)
			require.NotNil(t, st.Cutoff)
			require.Equal(t, "America/New_York", st.Cutoff.Zone)
			require.True(t, start.Equal(st.Cutoff.PeriodStart), "%s", st.Cutoff.PeriodStart)
			require.True(t, end.Equal(st.Cutoff.PeriodEnd), "%s", st.Cutoff.PeriodEnd)
			require.Nil(t, st.Adjustments)
		})
	}
}

func (b *bundle) text(t *testing.T, sql string, args ...any) string {
	t.Helper()
	var s string
	require.NoError(t, b.pool.QueryRow(context.Background(), sql, args...).Scan(&s))
	return s
}

// The population is fixed at the first claim: a run interrupted and
// resumed later, under another billing zone and after subscribers were
// added (activated back into the period) and deactivated, bills what the
// first claim's cutoff says, in the first claim's zone.
func TestResumeKeepsTheCutoff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	p := period
	utc := time.UTC
	var subs []sub
	for id := int64(1); id <= 100; id++ {
		subs = append(subs, sub{id: id, status: "ACTIVE", fee: 1000 + id})
	}
	// In the part the resume bills (ids above the first batches): activated
	// at 20:00 UTC on the last day, one day in UTC; in Asia/Tokyo that is the
	// next month, outside the period.
	subs = append(subs, sub{id: 150, status: "ACTIVE", fee: 3000, activated: at(p.End(utc).Add(-4 * time.Hour))})
	b.insertSubs(t, p, subs)

	interrupt, cancel := context.WithCancel(ctx)
	defer cancel()
	first := b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 10, Workers: 1}, stopAfter(2, cancel)))
	res := first.Run(interrupt, p, trig())
	require.Equal(t, job.OutcomeLost, res.Outcome, res.Error)
	require.Equal(t, int64(2), res.Counts["batches_committed"])
	var cutoff time.Time
	require.NoError(t, b.pool.QueryRow(ctx, `select cutoff_at from bill_runs where period = $1`, p.String()).Scan(&cutoff))

	// Between the interruption and the resume: a subscriber signs up with an
	// activation back-dated into the period, and one is terminated now.
	late := sub{id: 200, status: "ACTIVE", fee: 5000, activated: at(p.Start(utc).Add(48 * time.Hour))}
	b.insertSubs(t, p, []sub{late})
	_, err := b.pool.Exec(ctx, `update subscribers set status = 'TERMINATED', deactivated_at = now() where id = 95`)
	require.NoError(t, err)
	subs[94].status, subs[94].deactivated = "TERMINATED", at(time.Now())

	tokyo, err := time.LoadLocation("Asia/Tokyo")
	require.NoError(t, err)
	res = b.runner(billrun.Config{BatchSize: 10, Calendar: billrun.Calendar{Zone: tokyo}}).Run(ctx, p, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(2), res.Counts["batches_skipped"])
	require.Equal(t, int64(2), res.Fence)

	b.requireInvoices(t, p, utc, subs) // the first claim's zone and population: not 200, and 150 for one day
	require.Equal(t, int64(0), b.count(t, `select count(*) from invoices where subscriber_id = 200`), "created after the cutoff")
	require.Equal(t, int64(1), b.count(t, `select count(*) from invoices where subscriber_id = 150`), "billed in the first claim's zone")
	var after time.Time
	require.NoError(t, b.pool.QueryRow(ctx, `select cutoff_at from bill_runs where period = $1`, p.String()).Scan(&after))
	require.True(t, cutoff.Equal(after), "the resume keeps the cutoff")
	require.Equal(t, "UTC", b.text(t, `select billing_tz from bill_runs where period = $1`, p.String()))
}

// Usage that arrives after the period COMPLETED is reported (event, counts,
// metric) and invoiced by an adjustment run, once.
func TestLateUsageIsReportedAndAdjusted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	p := period
	subs := []sub{{id: 1, status: "ACTIVE", fee: 1000, usage: 100}, {id: 2, status: "ACTIVE", fee: 2000}, {id: 3, status: "ACTIVE", fee: 500}}
	b.insertSubs(t, p, subs)
	r := b.runner(billrun.Config{BatchSize: 2})

	adjust := func() job.Result {
		return r.template.Run(ctx, r.kind, params(r.kind, billrun.Request{Period: p, Adjust: true}), trig())
	}
	res := adjust()
	require.Equal(t, job.OutcomeFailed, res.Outcome, "nothing to adjust before the bill run")
	require.Contains(t, res.Error, "has no bill run")

	res = r.Run(ctx, p, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)

	// Nothing late yet: a repeated trigger answers already_completed, quietly.
	res = r.Run(ctx, p, trig())
	require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(0), res.Counts[billrun.CountLateUsageSubscribers])
	require.Empty(t, b.rec.OfType(events.BillrunLateUsage))

	// Usage arrives for two subscribers (and for another period).
	_, err := b.pool.Exec(ctx, `insert into usage_charges (subscriber_id, period, amount_cents) values (1, $1, 30), (1, $1, 12), (3, $1, 7), (2, $2, 999)`,
		p.String(), p.Previous().String())
	require.NoError(t, err)
	res = r.Run(ctx, p, trig())
	require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(2), res.Counts[billrun.CountLateUsageSubscribers])
	require.Equal(t, int64(49), res.Counts[billrun.CountLateUsageCents])
	late := b.rec.OfType(events.BillrunLateUsage)
	require.Len(t, late, 1)
	require.Equal(t, p.String(), late[0].Extra["period"])
	require.EqualValues(t, 2, late[0].Extra[billrun.CountLateUsageSubscribers])
	require.EqualValues(t, 49, late[0].Extra[billrun.CountLateUsageCents])
	require.Equal(t, billrun.LockKey(p), late[0].Key)

	res = adjust()
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(2), res.Counts[billrun.CountAdjustmentsCreated])
	require.Equal(t, int64(49), res.Counts[billrun.CountAdjustedCents])
	require.Equal(t, int64(0), res.Counts[billrun.CountLateUsageSubscribers])
	require.Equal(t, int64(42), b.count(t, `select amount_cents from invoice_adjustments where period = $1 and subscriber_id = 1`, p.String()))
	require.Equal(t, int64(7), b.count(t, `select amount_cents from invoice_adjustments where period = $1 and subscriber_id = 3`, p.String()))
	require.Equal(t, int64(1100), b.count(t, `select amount_cents from invoices where period = $1 and subscriber_id = 1`, p.String()),
		"the invoice is left as it was")

	// Run again: nothing left, nothing billed twice.
	res = adjust()
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(0), res.Counts[billrun.CountAdjustmentsCreated])
	require.Equal(t, int64(2), b.count(t, `select count(*) from invoice_adjustments where period = $1`, p.String()))
	require.Equal(t, int64(2), b.count(t, `select fence from bill_run_adjustments where period = $1`, p.String()), "each adjustment run claims fence+1")
	require.Equal(t, billrun.StatusCompleted, b.text(t, `select status from bill_run_adjustments where period = $1`, p.String()))
	st, err := r.Status(ctx, p)
	require.NoError(t, err)
	require.NotNil(t, st.Adjustments)
	require.Equal(t, billrun.Adjustments{Status: billrun.StatusCompleted, Fence: 2, Created: 2, AmountCents: 49, FinishedAt: st.Adjustments.FinishedAt}, *st.Adjustments)

	// More usage later: a second adjustment covers only it.
	_, err = b.pool.Exec(ctx, `insert into usage_charges (subscriber_id, period, amount_cents) values (2, $1, 5)`, p.String())
	require.NoError(t, err)
	res = adjust()
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(1), res.Counts[billrun.CountAdjustmentsCreated])
	require.Equal(t, int64(5), res.Counts[billrun.CountAdjustedCents])
	require.Equal(t, int64(0), b.count(t, `
		select count(*) from invoices i
		where i.period = $1 and (select coalesce(sum(amount_cents), 0) from usage_charges u where u.subscriber_id = i.subscriber_id and u.period = $1)
		      <> i.usage_cents + (select coalesce(sum(amount_cents), 0) from invoice_adjustments a where a.subscriber_id = i.subscriber_id and a.period = $1)`,
		p.String()), "every cent of usage is invoiced once")
}

// A period that has not ended is refused by the claim too (the transports
// refuse it as they decode): no row, outcome failed, the reason named.
func TestClaimRefusesAnOpenPeriod(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.insertSubs(t, period, []sub{{id: 1, status: "ACTIVE", fee: 1000}})
	open := billrun.PeriodOf(time.Now().UTC())
	for _, p := range []billrun.Period{open, open.Next(), {Year: 2999, Month: time.December}} {
		res := b.runner(billrun.Config{}).Run(ctx, p, trig())
		require.Equal(t, job.OutcomeFailed, res.Outcome, p.String())
		require.Contains(t, res.Error, billrun.ReasonPeriodNotClosed)
		require.Equal(t, int64(0), b.count(t, `select count(*) from bill_runs where period = $1`, p.String()))
	}
	// Closed in Pacific/Kiritimati (UTC+14) fourteen hours before UTC.
	kiri, err := time.LoadLocation("Pacific/Kiritimati")
	require.NoError(t, err)
	now := open.End(kiri).Add(time.Hour)
	res := b.runner(billrun.Config{Calendar: billrun.Calendar{Zone: kiri, Now: func() time.Time { return now }}}).Run(ctx, open, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
}

// An adjustment run is fenced like a bill run: one whose claim was
// superseded (its process paused, another replica claimed) writes nothing.
func TestStaleAdjustmentCannotCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.insertSubs(t, period, []sub{{id: 1, status: "ACTIVE", fee: 1000}, {id: 2, status: "ACTIVE", fee: 1000}})
	res := b.runner(billrun.Config{}).Run(ctx, period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	_, err := b.pool.Exec(ctx, `insert into usage_charges (subscriber_id, period, amount_cents) values (1, $1, 30), (2, $1, 20)`, period.String())
	require.NoError(t, err)

	adjust := billrun.Request{Period: period, Adjust: true}
	r := b.runner(billrun.Config{})
	stale, res := r.template.Begin(ctx, r.kind, params(r.kind, adjust), trig())
	require.NotNil(t, stale, res.Error)
	other := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-b"})
	defer other.Close()
	o := b.runnerWith(other, "", billrun.Config{})
	fresh, res := o.template.Begin(ctx, o.kind, params(o.kind, adjust), trig())
	require.NotNil(t, fresh, res.Error)
	require.Equal(t, stale.Fence()+1, fresh.Fence())

	res = stale.Execute(ctx)
	require.Equal(t, job.OutcomeLost, res.Outcome, res.Error)
	require.Equal(t, int64(0), b.count(t, `select count(*) from invoice_adjustments`))
	require.Equal(t, billrun.StatusRunning, b.text(t, `select status from bill_run_adjustments where period = $1`, period.String()),
		"the stale run does not touch the new claim")

	res = fresh.Execute(ctx)
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(2), res.Counts[billrun.CountAdjustmentsCreated])
	require.Equal(t, int64(2), b.count(t, `select count(*) from invoice_adjustments where adjust_fence = $1`, fresh.Fence()))
}
