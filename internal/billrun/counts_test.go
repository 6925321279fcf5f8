package billrun_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
)

// Every count of run.completed is the database's, for a run resumed after
// a failure whose first claim's commits were partly lost and that the
// completion repaired: compared with what fresh SQL counts say afterwards.
func TestCompletedCountsAreWhatTheDatabaseSays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.seed(t, billrun.SeedConfig{Subscribers: 400, SuspendedRatio: 0.1, TerminatedRatio: 0.05, Usage: true})
	// An invoice another writer made for the period: already invoiced.
	_, err := b.pool.Exec(ctx, `insert into invoices (subscriber_id, period, amount_cents)
		select min(id), $1, 1 from subscribers where status = 'ACTIVE'`, period.String())
	require.NoError(t, err)

	// The first claim fails at its 5th batch; the resume's 2nd batch finds
	// two of the first claim's batches lost.
	var n atomic.Int64
	first := b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 40, Workers: 1}, func(context.Context, int64, int64) error {
		if n.Add(1) == 5 {
			return errBoom
		}
		return nil
	}))
	res := first.Run(ctx, period, trig())
	require.Equal(t, job.OutcomeFailed, res.Outcome)
	var m atomic.Int64
	second := b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 40, Workers: 1}, func(ctx context.Context, _, _ int64) error {
		if m.Add(1) == 2 {
			_, _, err := b.loseBatches(ctx, period, 2, 3)
			return err
		}
		return nil
	}))
	res = second.Run(ctx, period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	b.requireExactlyOnce(t, period)
	require.Positive(t, res.Counts[billrun.CountRepaired])

	p := period.String()
	fence := res.Fence
	want := map[string]int64{
		billrun.CountPopulation:            b.count(t, `select count(*) from subscribers where status = 'ACTIVE'`),
		billrun.CountRepaired:              b.count(t, `select count(*) from invoices where period = $1 and bill_run_fence = $2 and subscriber_id not in (select s.id from subscribers s join bill_run_batches r on r.period = $1 and s.id between r.first_id and r.last_id)`, p, fence),
		billrun.CountInvoicesCreated:       b.count(t, `select count(*) from invoices where period = $1 and bill_run_fence = $2`, p, fence),
		billrun.CountPeriodInvoicesCreated: b.count(t, `select count(*) from invoices where period = $1 and bill_run_fence is not null`, p),
		billrun.CountPeriodAlreadyInvoiced: b.count(t, `select count(*) from invoices where period = $1 and bill_run_fence is null`, p),
		billrun.CountPeriodBatches:         b.count(t, `select count(*) from bill_run_batches where period = $1`, p),
		billrun.CountBatchesCommitted:      b.count(t, `select count(*) from bill_run_batches where period = $1 and fence = $2`, p, fence),
		billrun.CountBatchesSkipped:        b.count(t, `select count(*) from bill_run_batches where period = $1 and fence <> $2`, p, fence),
	}
	want[billrun.CountPeriodSubscribers] = want[billrun.CountPopulation]
	for k, v := range want {
		assert.Equal(t, v, res.Counts[k], "run result %s", k)
	}
	done := b.rec.OfType(events.RunCompleted)
	require.Len(t, done, 1)
	for k, v := range want {
		assert.EqualValues(t, v, done[0].Extra[k], "run.completed %s", k)
	}
	st, err := second.Status(ctx, period)
	require.NoError(t, err)
	assert.Equal(t, want[billrun.CountPopulation], st.Counts[billrun.CountPopulation])
	assert.Equal(t, want[billrun.CountRepaired], st.Counts[billrun.CountRepaired])
	assert.Equal(t, want[billrun.CountPeriodInvoicesCreated], st.Counts[billrun.CountInvoicesCreated])
}

// The repair bills a lost batch exactly as the batch would have, in a
// billing zone far from UTC, at the month's edges.
func TestRepairBillsLikeTheBatchesInAZone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	akl, err := time.LoadLocation("Pacific/Auckland")
	require.NoError(t, err)
	p := period
	start, end := p.Start(akl), p.End(akl)
	subs := []sub{
		{id: 1, status: "ACTIVE", fee: 3100},
		{id: 2, status: "ACTIVE", fee: 3100, activated: at(start.Add(-time.Minute))},
		{id: 3, status: "ACTIVE", fee: 3100, activated: at(end.Add(-time.Minute)), usage: 9},
		{id: 4, status: "TERMINATED", fee: 3100, deactivated: at(start.Add(time.Minute))},
		{id: 5, status: "TERMINATED", fee: 3100, deactivated: at(start)},
		{id: 6, status: "ACTIVE", fee: 3100, activated: at(end)},
		{id: 7, status: "TERMINATED", fee: 3100, activated: at(start.Add(36 * time.Hour)), deactivated: at(end.Add(-36 * time.Hour)), usage: 4},
		{id: 8, status: "SUSPENDED", fee: 3100, deactivated: at(end.Add(-time.Hour))},
	}
	b.insertSubs(t, p, subs)
	var n atomic.Int64
	hook := func(ctx context.Context, _, _ int64) error {
		if n.Add(1) == 2 {
			_, _, err := b.loseBatches(ctx, p, 1, 1)
			return err
		}
		return nil
	}
	res := b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 4, Workers: 1, Calendar: billrun.Calendar{Zone: akl}}, hook)).Run(ctx, p, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Positive(t, res.Counts[billrun.CountRepaired])
	b.requireInvoices(t, p, akl, subs)
}

var errBoom = boomError{}

type boomError struct{}

func (boomError) Error() string { return "boom" }
