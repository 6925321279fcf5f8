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
	"github.com/telco-platform/coordinator/internal/ownership"
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
		require.Equal(t, v, res.Counts[k], "run result %s", k)
	}
	done := b.rec.OfType(events.RunCompleted)
	require.Len(t, done, 1)
	for k, v := range want {
		require.EqualValues(t, v, done[0].Extra[k], "run.completed %s", k)
	}
	st, err := second.Status(ctx, period)
	require.NoError(t, err)
	require.Equal(t, want[billrun.CountPopulation], st.Counts[billrun.CountPopulation])
	require.Equal(t, want[billrun.CountRepaired], st.Counts[billrun.CountRepaired])
	require.Equal(t, want[billrun.CountPeriodInvoicesCreated], st.Counts[billrun.CountInvoicesCreated])
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

// A COMPLETED row lost with the last batches before it (a failover to an
// asynchronous replica: the row is RUNNING again, the batches' records and
// invoices gone) is run again by the resumer: every subscriber invoiced
// exactly once, a second run.completed with another id, counts from the
// database.
func TestALostCompletionIsRunAgainExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	seeded := b.seed(t, billrun.SeedConfig{Subscribers: 200, SuspendedRatio: 0.1, Usage: true})
	r := b.runner(billrun.Config{BatchSize: 20, Workers: 2})
	res := r.Run(ctx, period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	batches := b.count(t, `select count(*) from bill_run_batches where period = $1`, period.String())
	_, lostSubs, err := b.loseBatches(ctx, period, int(batches)-1, int(batches))
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `update bill_runs set status = 'RUNNING', finished_at = null, completed_event_at = null where period = $1`, period.String())
	require.NoError(t, err)

	scanOnce(t, b.runner(billrun.Config{BatchSize: 20}).template, time.Hour)
	st, err := r.Status(ctx, period)
	require.NoError(t, err)
	require.Equal(t, billrun.StatusCompleted, st.Status, st.LastError)
	require.Equal(t, int64(2), st.Fence)
	b.requireExactlyOnce(t, period)
	done := b.rec.OfType(events.RunCompleted)
	require.Len(t, done, 2)
	require.NotEqual(t, done[0].ID, done[1].ID)
	require.EqualValues(t, lostSubs, done[1].Extra[billrun.CountInvoicesCreated], "the lost batches billed again by the second claim")
	require.EqualValues(t, seeded.Active, done[1].Extra[billrun.CountPopulation])
	require.EqualValues(t, seeded.Active, done[1].Extra[billrun.CountPeriodInvoicesCreated])
	require.EqualValues(t, 0, done[1].Extra[billrun.CountRepaired], "their records were lost too: planned and billed as batches")
}

// An immediate restart of a server that acknowledges commits early, while
// the completion's repair is inserting, rolls the completion back whole;
// it is tried again once the server is back and completes with the gap
// billed once, durably.
func TestARestartDuringTheRepairIsSafe(t *testing.T) {
	t.Parallel()
	srv, pool := ownServer(t, "synchronous_commit=off", "wal_writer_delay=10s", "autovacuum=off")
	ctx := context.Background()
	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a"})
	defer locker.Close()
	b := &bundle{pool: pool, locker: locker, rec: &events.Recorder{}}
	subs := make([]sub, 0, 10)
	for id := int64(1); id <= 10; id++ {
		subs = append(subs, sub{id: id, status: "ACTIVE", fee: 1000, usage: id})
	}
	b.insertSubs(t, period, subs)
	gate, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer gate.Release()
	_, err = gate.Exec(ctx, `select pg_advisory_lock(230418)`)
	require.NoError(t, err)
	var n atomic.Int64
	hook := func(ctx context.Context, _, _ int64) error {
		if n.Add(1) != 2 {
			return nil
		}
		_, err := pool.Exec(ctx, `
			delete from invoices where period = '`+period.String()+`' and subscriber_id = 1;
			create function gate_invoice() returns trigger language plpgsql as $$
			begin perform pg_advisory_xact_lock_shared(230418); return new; end $$;
			create trigger gate_invoice before insert on invoices for each row
			when (new.subscriber_id = 1) execute function gate_invoice();
			checkpoint`)
		return err
	}
	result := make(chan job.Result, 1)
	go func() {
		result <- b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 5, Workers: 1, RetryBackoff: 100 * time.Millisecond}, hook)).
			Run(ctx, period, trig())
	}()
	require.Eventually(t, func() bool {
		var w int64
		return pool.QueryRow(ctx, `select count(*) from pg_stat_activity where wait_event_type = 'Lock' and wait_event = 'advisory'`).Scan(&w) == nil && w == 1
	}, 30*time.Second, 20*time.Millisecond, "the repair reaches the gate")
	srv.Kill() // the gate's session ends with it
	srv.Start()
	res := <-result
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	// Subscriber 1, and batch 2's subscribers if the restart lost its commit.
	require.GreaterOrEqual(t, res.Counts[billrun.CountRepaired], int64(1))
	srv.Kill()
	srv.Start()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		st, err := billrun.ReadStatus(ctx, pool, period)
		require.NoError(c, err)
		require.Equal(c, billrun.StatusCompleted, st.Status)
	}, 30*time.Second, 50*time.Millisecond)
	b.requireInvoices(t, period, time.UTC, subs)
}
