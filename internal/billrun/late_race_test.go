package billrun_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
)

// A usage charge whose transaction took its id before a check's snapshot
// and commits after it (so its changed_xid is below ids the check already
// saw committed: xid order is not commit order) is still reported by the
// next answer before the lock: the kept snapshot says which ids it did not
// see, not a watermark.
func TestLateUsageCommittedAfterTheCheckThatSawItRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newLateWorld(t, []sub{{id: 1, status: "ACTIVE", fee: 1000}, {id: 2, status: "ACTIVE", fee: 1000}})
	p := w.p.String()

	early, err := w.pool.Begin(ctx) // the older id, committed last
	require.NoError(t, err)
	defer func() { _ = early.Rollback(ctx) }()
	_, err = early.Exec(ctx, `insert into usage_charges (subscriber_id, period, amount_cents) values (1, $1, 11)`, p)
	require.NoError(t, err)
	w.exec(t, `insert into usage_charges (subscriber_id, period, amount_cents) values (2, $1, 5)`, p) // a younger id, committed first

	res, _ := w.answerWithoutLock(t, "the younger charge committed, the older one running")
	require.Equal(t, int64(1), res.Counts[billrun.CountLateUsageSubscribers])
	require.Equal(t, int64(5), res.Counts[billrun.CountLateUsageCents])

	require.NoError(t, early.Commit(ctx))
	res, _ = w.answerWithoutLock(t, "the older charge committed after the kept check")
	require.Equal(t, int64(2), res.Counts[billrun.CountLateUsageSubscribers])
	require.Equal(t, int64(16), res.Counts[billrun.CountLateUsageCents])
}

// Writes made with session_replication_role = replica (a logical
// replication subscriber applying the mediation system's usage, or a bulk
// load that sets it to skip foreign keys) fire no ordinary trigger. The
// triggers the kept check relies on fire anyway (ENABLE ALWAYS), so such a
// change is reported before the lock as the full check reports it.
func TestLateChangesWrittenAsAReplicaAreReported(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newLateWorld(t, []sub{
		{id: 1, status: "ACTIVE", fee: 1000, usage: 100},
		{id: 2, status: "ACTIVE", fee: 1000, usage: 40},
		{id: 3, status: "ACTIVE", fee: 1000},
	})
	p := w.p.String()
	asReplica := func(sql string, args ...any) {
		t.Helper()
		tx, err := w.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `set local session_replication_role = replica`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
		require.NoError(t, tx.Commit(ctx))
	}
	w.answerWithoutLock(t, "nothing late")
	asReplica(`update usage_charges set amount_cents = amount_cents + 9 where subscriber_id = 1 and period = $1`, p)
	res, _ := w.answerWithoutLock(t, "usage updated as a replica")
	require.Equal(t, int64(1), res.Counts[billrun.CountLateUsageSubscribers])
	asReplica(`delete from usage_charges where subscriber_id = 2 and period = $1`, p)
	w.answerWithoutLock(t, "usage deleted as a replica")
	asReplica(`delete from invoices where subscriber_id = 3 and period = $1`, p)
	res, _ = w.answerWithoutLock(t, "an invoice deleted as a replica")
	require.Equal(t, int64(1), res.Counts[billrun.CountUnbilledSubscribers])
}

// Deleting some rows of bill_run_changes (a clean-up by hand, "older than
// a month") would hide the changes they record from every kept check. The
// kept checks go with them, as with a truncate: the next trigger checks in
// full, under the lock, and reports what is late.
func TestPruningBillRunChangesForgetsTheKeptChecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newLateWorld(t, []sub{{id: 1, status: "ACTIVE", fee: 1000, usage: 100}})
	p := w.p.String()
	w.answerWithoutLock(t, "nothing late")
	w.exec(t, `delete from usage_charges where subscriber_id = 1 and period = $1`, p)
	w.exec(t, `delete from bill_run_changes where period = $1`, p)

	full := w.checks(t, "full")
	res := w.r.Run(ctx, w.p, trig())
	require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(1), res.Counts[billrun.CountLateUsageSubscribers], "the deleted charge, seen in full")
	require.Equal(t, full+1, w.checks(t, "full"), "checked in full under the lock")
	w.answerWithoutLock(t, "kept again after the full check")
}

// A bulk change of subscribers after the completion (a price change on
// every row) makes every one of them changed since the kept snapshot. More
// than maxLateIDs of them are not evaluated one by one by every trigger
// (each probe set per subscriber, across the whole table, for every
// COMPLETED period): the trigger takes the lock and checks in full once,
// which keeps a fresh snapshot, and the next is answered from it again.
func TestABulkChangeSendsTheCheckInFullOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 12000})
	w := &lateWorld{bundle: b, reg: prometheus.NewRegistry(), p: period}
	w.r = b.runner(billrun.Config{BatchSize: 4000, Metrics: billrun.NewMetrics(w.reg)})
	res := w.r.Run(ctx, w.p, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	w.answerWithoutLock(t, "nothing changed")

	w.exec(t, `update subscribers set monthly_fee_cents = monthly_fee_cents + 1`)
	res = w.r.Run(ctx, w.p, trig())
	require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome, res.Error)
	require.Equal(t, float64(1), w.checks(t, "full"), "12,000 changed subscribers: checked in full under the lock")
	w.answerWithoutLock(t, "from the snapshot the full check kept")
}

// Postgres lost in the middle of the check before the lock (its backend
// terminated while the statement waits) never answers already_completed:
// the trigger goes the locked way, here unavailable with the lock backend
// down.
func TestACheckCutOffMidwayTakesTheLockedWay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newLateWorld(t, []sub{{id: 1, status: "ACTIVE", fee: 1000}})
	hold, err := w.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `lock table bill_run_late in access exclusive mode`)
	require.NoError(t, err)

	w.locker.SetUnavailable(true)
	defer w.locker.SetUnavailable(false)
	n := len(w.rec.Events())
	done := make(chan job.Result, 1)
	go func() { done <- w.r.Run(ctx, w.p, trig()) }()
	require.Eventually(t, func() bool {
		var killed bool
		err := w.pool.QueryRow(ctx, `select coalesce(bool_or(pg_terminate_backend(pid)), false) from pg_locks
			where relation = 'bill_run_late'::regclass and not granted`).Scan(&killed)
		return err == nil && killed
	}, 30*time.Second, 10*time.Millisecond, "the check waits on bill_run_late")
	res := <-done
	require.Equal(t, job.OutcomeUnavailable, res.Outcome, res.Error)
	require.Empty(t, ofType(w.since(n), events.RunAlreadyCompleted))
}

// A check's write-back that lost a race with a prune of bill_run_changes
// and the full check after it never lands on the fresh row: a kept row's
// version is never reused, so the stale snapshot (blind to the pruned
// change) cannot replace the full check's.
func TestAStaleWriteBackNeverReplacesAFreshFullCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newLateWorld(t, []sub{{id: 1, status: "ACTIVE", fee: 1000}, {id: 2, status: "ACTIVE", fee: 1000, usage: 40}})
	p := w.p.String()
	fullUnderLock := func(what string) {
		t.Helper()
		w.exec(t, `delete from bill_run_changes`) // pruned by hand: every kept row goes
		full := w.checks(t, "full")
		res := w.r.Run(ctx, w.p, trig())
		require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome, res.Error)
		require.Equal(t, full+1, w.checks(t, "full"), what)
	}
	fullUnderLock("the first full check")
	w.exec(t, `insert into usage_charges (subscriber_id, period, amount_cents) values (1, $1, 3)`, p)
	stale, ok, err := billrun.ReadKeptCheck(ctx, w.pool, w.p) // a check, before it writes back
	require.NoError(t, err)
	require.True(t, ok)

	w.exec(t, `delete from usage_charges where subscriber_id = 2 and period = $1`, p) // seen only in bill_run_changes
	fullUnderLock("the second full check, after the prune")
	landed, err := billrun.RefreshKeptCheck(ctx, w.pool, w.p, stale)
	require.NoError(t, err)
	require.False(t, landed, "the stale write-back")
	res, _ := w.answerWithoutLock(t, "after the stale write-back")
	require.Equal(t, int64(2), res.Counts[billrun.CountLateUsageSubscribers])
}
