package billrun_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// lateWorld is a COMPLETED period and a runner whose metrics the test reads.
type lateWorld struct {
	*bundle
	r   runner
	reg *prometheus.Registry
	p   billrun.Period
}

func newLateWorld(t *testing.T, subs []sub) *lateWorld {
	t.Helper()
	b := setup(t)
	w := &lateWorld{bundle: b, reg: prometheus.NewRegistry(), p: period}
	b.insertSubs(t, w.p, subs)
	w.r = b.runner(billrun.Config{BatchSize: 3, Metrics: billrun.NewMetrics(w.reg)})
	res := w.r.Run(context.Background(), w.p, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	return w
}

func (w *lateWorld) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := w.pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err, sql)
}

// checks is coordinator_billrun_late_checks_total{how}.
func (w *lateWorld) checks(t *testing.T, how string) float64 {
	t.Helper()
	return value(t, w.reg, "coordinator_billrun_late_checks_total", how)
}

// since returns the events emitted after the first n.
func (w *lateWorld) since(n int) []events.Event { return w.rec.Events()[n:] }

// ofType filters evs.
func ofType(evs []events.Event, typ events.Type) []events.Event {
	var out []events.Event
	for _, e := range evs {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// answerWithoutLock triggers the period with the lock backend down: only
// an answer given before the lock can be already_completed. It checks the
// answer against the check as it was before issue 28 and returns it, with
// the trigger's events.
func (w *lateWorld) answerWithoutLock(t *testing.T, what string) (job.Result, []events.Event) {
	t.Helper()
	w.locker.SetUnavailable(true)
	defer w.locker.SetUnavailable(false)
	n := len(w.rec.Events())
	full := w.checks(t, "full")
	res := w.r.Run(context.Background(), w.p, trig())
	require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome, "%s: %s", what, res.Error)
	require.Equal(t, full, w.checks(t, "full"), "%s: answered from the kept check, not in full", what)
	lateSubs, lateCents, unbilled, err := billrun.LateReference(context.Background(), w.pool, w.p)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{
		billrun.CountLateUsageSubscribers: lateSubs, billrun.CountLateUsageCents: lateCents, billrun.CountUnbilledSubscribers: unbilled,
	}, map[string]int64{
		billrun.CountLateUsageSubscribers: res.Counts[billrun.CountLateUsageSubscribers],
		billrun.CountLateUsageCents:       res.Counts[billrun.CountLateUsageCents],
		billrun.CountUnbilledSubscribers:  res.Counts[billrun.CountUnbilledSubscribers],
	}, "%s: the same as the full check", what)
	evs := w.since(n)
	require.Equal(t, true, ofType(evs, events.RunAlreadyCompleted)[0].Extra[owned.DataBeforeLock], what)
	return res, evs
}

// A trigger for a COMPLETED period is answered before the lock (here: with
// the lock backend down, where the locked way can only say unavailable), and
// late usage and unbilled subscribers that arrive after the completion are
// reported exactly as the full check reports them, through every kind of
// change: usage inserted, updated, deleted, moved to another subscriber;
// subscribers loaded or backdated into the period; invoices written by
// another writer, edited or deleted by hand; an adjustment run. Every answer
// is the kept check's (coordinator_billrun_late_checks_total{how="kept"}),
// never the full one.
func TestLateUsageAfterCompletionIsReportedBeforeTheLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newLateWorld(t, []sub{
		{id: 1, status: "ACTIVE", fee: 1000, usage: 100},
		{id: 2, status: "ACTIVE", fee: 2000},
		{id: 3, status: "ACTIVE", fee: 500, usage: 5},
		{id: 4, status: "ACTIVE", fee: 700},
		{id: 5, status: "ACTIVE", fee: 700, activated: at(period.End(time.UTC).Add(72 * time.Hour))}, // not in the period
	})
	p := w.p.String()

	res, evs := w.answerWithoutLock(t, "nothing late")
	require.Equal(t, int64(0), res.Counts[billrun.CountLateUsageSubscribers])
	require.Equal(t, []events.Type{events.RunAlreadyCompleted}, types(evs), "no lock acquired or released, nothing late")
	require.Equal(t, "replica-a", evs[0].Owner)
	require.Equal(t, int64(1), evs[0].Fence)
	st, err := w.r.Status(ctx, w.p)
	require.NoError(t, err)
	for _, k := range []string{billrun.CountSubscribers, billrun.CountInvoicesCreated, billrun.CountAlreadyInvoiced, billrun.CountRepaired, billrun.CountPopulation} {
		period := map[string]string{billrun.CountSubscribers: billrun.CountPeriodSubscribers, billrun.CountInvoicesCreated: billrun.CountPeriodInvoicesCreated,
			billrun.CountAlreadyInvoiced: billrun.CountPeriodAlreadyInvoiced}[k]
		if period == "" {
			period = k
		}
		require.Equal(t, st.Counts[k], res.Counts[period], "%s: the period's totals, as the locked answer has them", k)
	}
	require.Equal(t, st.Counts[billrun.CountBatchesCommitted], res.Counts[billrun.CountPeriodBatches])

	w.exec(t, `insert into usage_charges (subscriber_id, period, amount_cents) values (1, $1, 30), (1, $1, 12), (3, $1, 7), (2, $2, 999)`,
		p, w.p.Previous().String())
	res, evs = w.answerWithoutLock(t, "usage inserted")
	require.Equal(t, int64(2), res.Counts[billrun.CountLateUsageSubscribers])
	require.Equal(t, int64(49), res.Counts[billrun.CountLateUsageCents])
	late := ofType(evs, events.BillrunLateUsage)
	require.Len(t, late, 1)
	require.EqualValues(t, 2, late[0].Extra[billrun.CountLateUsageSubscribers])

	w.answerWithoutLock(t, "nothing changed since the last answer")
	w.exec(t, `update usage_charges set amount_cents = amount_cents + 1 where subscriber_id = 3 and period = $1 and amount_cents = 7`, p)
	w.answerWithoutLock(t, "usage updated")
	w.exec(t, `delete from usage_charges where subscriber_id = 3 and period = $1 and amount_cents = 5`, p)
	w.answerWithoutLock(t, "billed usage deleted (the invoice now covers more than there is)")
	w.exec(t, `update usage_charges set subscriber_id = 4 where subscriber_id = 1 and period = $1 and amount_cents = 100`, p)
	w.answerWithoutLock(t, "usage moved to another subscriber")
	w.exec(t, `update usage_charges set period = $2 where subscriber_id = 4 and period = $1`, p, w.p.Previous().String())
	w.answerWithoutLock(t, "usage moved to another period")

	w.exec(t, `insert into subscribers (id, status, monthly_fee_cents) values (6, 'ACTIVE', 900), (7, 'TERMINATED', 900)`)
	res, _ = w.answerWithoutLock(t, "subscribers loaded after the cutoff")
	require.Equal(t, int64(1), res.Counts[billrun.CountUnbilledSubscribers])
	w.exec(t, `update subscribers set activated_at = $1 where id = 5`, w.p.Start(time.UTC).Add(24*time.Hour))
	res, _ = w.answerWithoutLock(t, "a subscriber backdated into the period")
	require.Equal(t, int64(2), res.Counts[billrun.CountUnbilledSubscribers])
	w.exec(t, `update subscribers set status = 'TERMINATED' where id = 6`)
	w.answerWithoutLock(t, "an unbilled subscriber terminated by status alone")
	w.exec(t, `delete from subscribers where id = 7`)
	w.answerWithoutLock(t, "a subscriber deleted")

	w.exec(t, `insert into invoices (subscriber_id, period, amount_cents, usage_cents) values (5, $1, 1, 0)`, p)
	w.answerWithoutLock(t, "another writer invoiced an unbilled subscriber")
	w.exec(t, `delete from invoices where subscriber_id = 2 and period = $1`, p)
	res, _ = w.answerWithoutLock(t, "an invoice deleted by hand")
	require.GreaterOrEqual(t, res.Counts[billrun.CountUnbilledSubscribers], int64(1))
	w.exec(t, `update invoices set usage_cents = usage_cents + 3 where subscriber_id = 1 and period = $1`, p)
	w.answerWithoutLock(t, "an invoice's usage edited by hand")
	w.exec(t, `insert into invoice_adjustments (subscriber_id, period, amount_cents, adjust_fence) values (1, $1, 2, 99)`, p)
	w.answerWithoutLock(t, "an adjustment written by hand")

	adj := w.r.template.Run(ctx, w.r.kind, params(w.r.kind, billrun.Request{Period: w.p, Adjust: true}), trig())
	require.Equal(t, job.OutcomeCompleted, adj.Outcome, adj.Error)
	require.Equal(t, int64(0), adj.Counts[billrun.CountLateUsageSubscribers])
	require.Equal(t, int64(0), adj.Counts[billrun.CountUnbilledSubscribers])
	res, _ = w.answerWithoutLock(t, "after an adjustment run")
	require.Equal(t, int64(0), res.Counts[billrun.CountLateUsageSubscribers])
	w.exec(t, `insert into usage_charges (subscriber_id, period, amount_cents) values (2, $1, 5)`, p)
	res, _ = w.answerWithoutLock(t, "usage after the adjustment")
	require.Equal(t, int64(1), res.Counts[billrun.CountLateUsageSubscribers])
	require.Equal(t, float64(0), w.checks(t, "full"), "no check read the period's invoices")
}

// Random changes of every kind, each followed by a trigger answered before
// the lock: every answer is the full check's, and none reads the period's
// invoices in full.
func TestRandomLateChangesMatchTheFullCheck(t *testing.T) {
	t.Parallel()
	var subs []sub
	for id := int64(1); id <= 40; id++ {
		subs = append(subs, sub{id: id, status: "ACTIVE", fee: 100 * id, usage: id % 3 * 10})
	}
	w := newLateWorld(t, subs)
	p, other := w.p.String(), w.p.Previous().String()
	rng := rand.New(rand.NewPCG(28, 1))
	next := int64(100)
	steps := []func() string{
		func() string {
			id := rng.Int64N(45) + 1
			_, _ = w.pool.Exec(context.Background(), `insert into usage_charges (subscriber_id, period, amount_cents) select $1, $2, $3 where exists (select from subscribers where id = $1)`, id, p, rng.Int64N(50))
			return fmt.Sprintf("usage for %d", id)
		},
		func() string {
			w.exec(t, `update usage_charges set amount_cents = amount_cents + 1 where id = (select id from usage_charges where period = $1 order by random() limit 1)`, p)
			return "a usage charge updated"
		},
		func() string {
			w.exec(t, `delete from usage_charges where id = (select id from usage_charges where period = $1 order by random() limit 1)`, p)
			return "a usage charge deleted"
		},
		func() string {
			w.exec(t, `update usage_charges set period = $2 where id = (select id from usage_charges where period = $1 order by random() limit 1)`, p, other)
			return "a usage charge moved to another period"
		},
		func() string {
			next++
			w.exec(t, `insert into subscribers (id, status, monthly_fee_cents, activated_at) values ($1, 'ACTIVE', 100, $2)`,
				next, []any{nil, w.p.End(time.UTC).Add(time.Hour), w.p.Start(time.UTC).Add(time.Hour)}[rng.IntN(3)])
			return fmt.Sprintf("subscriber %d loaded", next)
		},
		func() string {
			w.exec(t, `update subscribers set deactivated_at = $1, activated_at = null where id = (select id from subscribers order by random() limit 1)`,
				[]any{nil, w.p.Start(time.UTC).Add(-time.Hour), w.p.Start(time.UTC).Add(time.Hour)}[rng.IntN(3)])
			return "a subscriber's dates changed"
		},
		func() string {
			w.exec(t, `delete from invoices where id = (select id from invoices where period = $1 order by random() limit 1)`, p)
			return "an invoice deleted"
		},
		func() string {
			w.exec(t, `insert into invoices (subscriber_id, period, amount_cents, usage_cents)
				select id, $1, 1, $2 from subscribers s where not exists (select from invoices i where i.subscriber_id = s.id and i.period = $1)
				order by random() limit 1`, p, rng.Int64N(3))
			return "another writer's invoice"
		},
		func() string {
			w.exec(t, `insert into invoice_adjustments (subscriber_id, period, amount_cents, adjust_fence)
				select subscriber_id, $1, 3, $2 from invoices where period = $1 order by random() limit 1`, p, 1000+next)
			next++
			return "an adjustment written by hand"
		},
	}
	for i := range 60 {
		what := steps[rng.IntN(len(steps))]()
		w.answerWithoutLock(t, fmt.Sprintf("step %d: %s", i, what))
	}
	require.Equal(t, float64(0), w.checks(t, "full"))
	require.Positive(t, w.checks(t, "kept"))
}

// The fast way is only for a COMPLETED row, not being adjusted, with a kept
// check for its fence; anything else takes the lock, as before.
func TestWhatTakesTheLockStill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	unavailable := func(t *testing.T, w *lateWorld, what string, req billrun.Request) {
		t.Helper()
		w.locker.SetUnavailable(true)
		defer w.locker.SetUnavailable(false)
		res := w.r.template.Run(ctx, w.r.kind, params(w.r.kind, req), trig())
		require.Equal(t, job.OutcomeUnavailable, res.Outcome, "%s: the lock was asked", what)
	}

	t.Run("an adjustment run in progress", func(t *testing.T) {
		t.Parallel()
		w := newLateWorld(t, []sub{{id: 1, status: "ACTIVE", fee: 1000}})
		w.exec(t, `insert into usage_charges (subscriber_id, period, amount_cents) values (1, $1, 30)`, w.p.String())
		o, res := w.r.template.Begin(ctx, w.r.kind, params(w.r.kind, billrun.Request{Period: w.p, Adjust: true}), trig())
		require.NotNil(t, o, res.Error)
		// A trigger meanwhile waits for the lock the adjustment holds, as before.
		res = w.r.Run(ctx, w.p, trig())
		require.Equal(t, job.OutcomeAlreadyOwned, res.Outcome, res.Error)
		unavailable(t, w, "adjusting", billrun.Request{Period: w.p})
		res = o.Execute(ctx)
		require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
		res, _ = w.answerWithoutLock(t, "after the adjustment")
		require.Equal(t, int64(0), res.Counts[billrun.CountLateUsageSubscribers])
		unavailable(t, w, "an adjustment run itself", billrun.Request{Period: w.p, Adjust: true})
	})

	t.Run("a row set back from COMPLETED by hand", func(t *testing.T) {
		t.Parallel()
		w := newLateWorld(t, []sub{{id: 1, status: "ACTIVE", fee: 1000}, {id: 2, status: "ACTIVE", fee: 1000}})
		for _, status := range []string{billrun.StatusRunning, billrun.StatusFailed, billrun.StatusInterrupted} {
			w.exec(t, `update bill_runs set status = $2 where period = $1`, w.p.String(), status)
			unavailable(t, w, status, billrun.Request{Period: w.p})
		}
		// Billed again: the completion keeps a check for its own fence, from
		// the one the row kept, with what changed meanwhile.
		w.exec(t, `delete from invoices where subscriber_id = 2 and period = $1`, w.p.String())
		w.exec(t, `insert into usage_charges (subscriber_id, period, amount_cents) values (1, $1, 8)`, w.p.String())
		w.exec(t, `insert into subscribers (id, status, monthly_fee_cents) values (3, 'ACTIVE', 1000)`)
		res := w.r.Run(ctx, w.p, trig())
		require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
		require.Equal(t, int64(1), res.Counts[billrun.CountRepaired])
		require.Equal(t, int64(2), w.count(t, `select fence from bill_runs where period = $1`, w.p.String()))
		res, _ = w.answerWithoutLock(t, "re-billed")
		require.Equal(t, int64(1), res.Counts[billrun.CountLateUsageSubscribers])
		require.Equal(t, int64(1), res.Counts[billrun.CountUnbilledSubscribers])
		require.Equal(t, int64(2), res.Fence)
	})

	t.Run("no kept check: the first answer checks in full under the lock and keeps it", func(t *testing.T) {
		t.Parallel()
		w := newLateWorld(t, []sub{{id: 1, status: "ACTIVE", fee: 1000, usage: 4}})
		w.exec(t, `truncate bill_run_changes`) // takes every kept check along
		require.Equal(t, int64(0), w.count(t, `select count(*) from bill_run_late`))
		unavailable(t, w, "nothing kept", billrun.Request{Period: w.p})
		w.exec(t, `insert into usage_charges (subscriber_id, period, amount_cents) values (1, $1, 3)`, w.p.String())
		n := len(w.rec.Events())
		res := w.r.Run(ctx, w.p, trig())
		require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome, res.Error)
		require.Equal(t, int64(1), res.Counts[billrun.CountLateUsageSubscribers])
		require.Equal(t, []events.Type{events.OwnershipAcquired, events.BillrunLateUsage, events.RunAlreadyCompleted, events.OwnershipReleased},
			types(w.since(n)))
		require.Equal(t, float64(1), w.checks(t, "full"))
		w.exec(t, `insert into usage_charges (subscriber_id, period, amount_cents) values (1, $1, 3)`, w.p.String())
		res, _ = w.answerWithoutLock(t, "kept by the full check")
		require.Equal(t, int64(6), res.Counts[billrun.CountLateUsageCents])
	})

	t.Run("invoices before the first claim: no base, the first answer checks in full", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		reg := prometheus.NewRegistry()
		b.insertSubs(t, period, []sub{{id: 1, status: "ACTIVE", fee: 1000}, {id: 2, status: "ACTIVE", fee: 1000, usage: 9}})
		_, err := b.pool.Exec(ctx, `insert into invoices (subscriber_id, period, amount_cents, usage_cents) values (2, $1, 1, 0)`, period.String())
		require.NoError(t, err)
		w := &lateWorld{bundle: b, reg: reg, p: period, r: b.runner(billrun.Config{Metrics: billrun.NewMetrics(reg)})}
		res := w.r.Run(ctx, w.p, trig())
		require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
		unavailable(t, w, "no base", billrun.Request{Period: w.p})
		res = w.r.Run(ctx, w.p, trig())
		require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome, res.Error)
		require.Equal(t, int64(1), res.Counts[billrun.CountLateUsageSubscribers], "the other writer's invoice did not cover the usage")
		require.Equal(t, float64(1), w.checks(t, "full"))
		w.answerWithoutLock(t, "kept by the full check")
	})

	t.Run("no row, and a period not closed", func(t *testing.T) {
		t.Parallel()
		w := &lateWorld{bundle: setup(t), p: period}
		w.r = w.runner(billrun.Config{})
		unavailable(t, w, "no row", billrun.Request{Period: w.p})
		unavailable(t, w, "the open month (the claim refuses it under the lock)", billrun.Request{Period: billrun.PeriodOf(time.Now().UTC())})
	})
}

// The kept check reads no relation of the period in full: every table is
// reached by index, whatever the period's size, and the statement is cheap
// enough that Postgres does not compile it (a first version was planned for
// a third of usage_charges as candidates, joined the period's invoices by
// hash and spent a second in JIT on every duplicate).
func TestTheKeptCheckReadsByIndexOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.seed(t, billrun.SeedConfig{Subscribers: 20000, Usage: true})
	_, err := b.pool.Exec(ctx, `analyze subscribers`)
	require.NoError(t, err)
	res := b.runner(billrun.Config{BatchSize: 2500}).Run(ctx, period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	_, err = b.pool.Exec(ctx, `analyze invoices`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `insert into usage_charges (subscriber_id, period, amount_cents) values (7, $1, 5)`, period.String())
	require.NoError(t, err)

	raw, err := billrun.ExplainKeptCheck(ctx, b.pool, period)
	require.NoError(t, err)
	var plans []struct {
		Plan map[string]any `json:"Plan"`
		JIT  map[string]any `json:"JIT"`
	}
	require.NoError(t, json.Unmarshal([]byte(raw), &plans))
	require.Nil(t, plans[0].JIT, "not compiled: %s", raw)
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if rel, ok := n["Relation Name"].(string); ok && (rel == "invoices" || rel == "subscribers" || rel == "usage_charges") {
			require.Contains(t, []string{"Index Scan", "Index Only Scan", "Bitmap Heap Scan"}, n["Node Type"], "%s read by %s", rel, n["Node Type"])
		}
		if n["Node Type"] == "Bitmap Index Scan" || n["Node Type"] == "Index Scan" {
			rows, _ := n["Actual Rows"].(float64)
			require.Less(t, rows, float64(100), "%s read %v rows", n["Index Name"], rows)
		}
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			walk(k.(map[string]any))
		}
	}
	walk(plans[0].Plan)
}
