package billrun_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
)

// A subscriber that moves into the population while the completion
// repairs a gap (reactivated between the repair's statement and the count
// after it) is a change after the cutoff like any other: the completion
// must not take it for a gap its repair could not close, fail the run and
// page. The completion reads one snapshot: the repair and the count after
// it see the same population. (Before, the count after the repair saw the
// reactivated subscriber and the run failed, paging: "1 subscriber(s) of
// the population still have no invoice after the repair".)
func TestAChangeDuringTheRepairIsNotAnUnrepairableGap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	subs := make([]sub, 0, 11)
	for id := int64(1); id <= 10; id++ {
		subs = append(subs, sub{id: id, status: "ACTIVE", fee: 1000})
	}
	subs = append(subs, sub{id: 11, status: "SUSPENDED", fee: 1000}) // not in the population (yet)
	b.insertSubs(t, period, subs)

	// The repair's invoice of subscriber 1 waits on an advisory lock the
	// test holds, so the test can commit a change while the repair runs.
	gate, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer gate.Release()
	_, err = gate.Exec(ctx, `select pg_advisory_lock(230417)`)
	require.NoError(t, err)
	var n atomic.Int64
	hook := func(ctx context.Context, _, _ int64) error {
		if n.Add(1) != 2 {
			return nil
		}
		// Batch 1 (ids 1-5) committed: its invoice of subscriber 1 vanishes
		// (a lost commit), and the repair's will wait at the gate.
		_, err := b.pool.Exec(ctx, `
			delete from invoices where period = '`+period.String()+`' and subscriber_id = 1;
			create function gate_invoice() returns trigger language plpgsql as $$
			begin perform pg_advisory_xact_lock_shared(230417); return new; end $$;
			create trigger gate_invoice before insert on invoices for each row
			when (new.subscriber_id = 1) execute function gate_invoice()`)
		return err
	}
	reg := prometheus.NewRegistry()
	result := make(chan job.Result, 1)
	go func() {
		result <- b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 5, Workers: 1, Metrics: billrun.NewMetrics(reg)}, hook)).
			Run(ctx, period, trig())
	}()
	require.Eventually(t, func() bool {
		return b.count(t, `select count(*) from pg_stat_activity where wait_event_type = 'Lock' and wait_event = 'advisory'
			and datname = current_database()`) == 1
	}, 30*time.Second, 20*time.Millisecond, "the repair reaches the gate")
	_, err = b.pool.Exec(ctx, `update subscribers set status = 'ACTIVE' where id = 11`)
	require.NoError(t, err)
	_, err = gate.Exec(ctx, `select pg_advisory_unlock(230417)`)
	require.NoError(t, err)

	res := <-result
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(1), res.Counts[billrun.CountRepaired])
	require.Equal(t, int64(10), res.Counts[billrun.CountPopulation], "the population of the completion's snapshot")
	require.Equal(t, 0.0, value(t, reg, "coordinator_billrun_reconcile_failures_total", ""), "nothing to page about")
	// Subscriber 11, reactivated after the snapshot, is the adjustment
	// run's (as any subscriber changed after the run).
	res = b.runner(billrun.Config{}).Run(ctx, period, trig())
	require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(1), res.Counts[billrun.CountUnbilledSubscribers])
}
