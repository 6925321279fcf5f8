package billrun_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// The claim's connection is killed (pg_terminate_backend) while the claim
// waits for the bill_runs row: the claim is retried on a new connection and
// the run completes. Before, the run failed at once and its trigger was
// committed.
func TestClaimRetriesADroppedConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 300, SuspendedRatio: 0.1, Usage: true})
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `insert into bill_runs (period, status, owner, fence) values ($1, 'INTERRUPTED', 'gone', 1)`, period.String())
	require.NoError(t, err)

	// The claim's upsert waits for this row lock, so its backend can be
	// found and terminated mid-statement.
	blocker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	var blockerPID int32
	require.NoError(t, blocker.QueryRow(ctx, `select pg_backend_pid()`).Scan(&blockerPID))
	_, err = blocker.Exec(ctx, `select 1 from bill_runs where period = $1 for update`, period.String())
	require.NoError(t, err)

	result := make(chan job.Result, 1)
	go func() { result <- b.runner(billrun.Config{}).Run(ctx, period, trig()) }()
	// claimWaiting is the backend of the claim waiting for the row, other
	// than not.
	claimWaiting := func(not int32) int32 {
		var pid int32
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			err := b.pool.QueryRow(ctx, `select pid from pg_stat_activity
				where $1 = any(pg_blocking_pids(pid)) and pid <> $2 and query ilike '%insert into bill_runs%'`,
				blockerPID, not).Scan(&pid)
			require.NoError(c, err, "the claim waiting for the bill_runs row")
		}, 30*time.Second, 10*time.Millisecond)
		return pid
	}
	first := claimWaiting(0)
	_, err = b.pool.Exec(ctx, `select pg_terminate_backend($1)`, first)
	require.NoError(t, err)
	claimWaiting(first) // the retry, on another connection, waits for the row again
	require.NoError(t, blocker.Rollback(ctx))

	res := <-result
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.EqualValues(t, 2, res.Fence, "one claim committed")
	b.requireExactlyOnce(t, period)
}

// Postgres down for longer than a batch's retries: the run ends FAILED for
// a transient cause (retryable) and, with no new trigger, the resumer
// (owned.Resumer) resumes it from the committed batches once Postgres is
// back, and it completes with exact invoices.
func TestPostgresDownLongerThanRetriesIsResumed(t *testing.T) {
	t.Parallel()
	srv := testenv.StartPostgresServer(t)
	ctx := context.Background()
	pool, err := postgres.Connect(ctx, srv.DSN(), 8)
	require.NoError(t, err)
	defer pool.Close()
	m, err := migrate.New(pool)
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	p := billrun.Period{Year: 2026, Month: time.October}
	_, err = billrun.Seed(ctx, pool, billrun.SeedConfig{Subscribers: 2000, SuspendedRatio: 0.1, Usage: true, Period: p})
	require.NoError(t, err)
	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a"})
	defer locker.Close()
	b := &bundle{pool: pool, locker: locker, rec: &events.Recorder{}}

	// The worker holds before batch 4 until Postgres is down.
	var n atomic.Int64
	at4, release := make(chan struct{}), make(chan struct{})
	resume := sync.OnceFunc(func() { close(release) })
	t.Cleanup(resume)
	hook := func(context.Context, int64, int64) error {
		if n.Add(1) == 4 {
			close(at4)
			<-release
		}
		return nil
	}
	finishing := newLogSignal("billrun_retry", "step", "finish")
	r := b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 100, Workers: 1, MaxBatchAttempts: 2,
		RetryBackoff: 50 * time.Millisecond, Logger: slog.New(finishing)}, hook))
	result := make(chan job.Result, 1)
	go func() { result <- r.Run(ctx, p, trig()) }()
	select {
	case <-at4:
	case res := <-result:
		t.Fatalf("the run ended before batch 4: %+v", res)
	}
	srv.Stop()
	resume()
	select {
	case <-finishing.seen: // the batch's tries are spent; the run waits to mark itself FAILED
	case res := <-result:
		t.Fatalf("the run ended while Postgres was down: %+v", res)
	}
	srv.Start()
	res := <-result
	require.Equal(t, job.OutcomeFailed, res.Outcome)
	require.True(t, res.Retryable, "a lost connection is transient: %s", res.Error)
	st, err := r.Status(ctx, p)
	require.NoError(t, err)
	require.Equal(t, billrun.StatusFailed, st.Status)

	rs, err := owned.NewResumer(owned.ResumerConfig{Runner: r.template, Interval: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, rs.Start(ctx))
	defer rs.Stop()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		st, err := r.Status(ctx, p)
		require.NoError(c, err)
		require.Equal(c, billrun.StatusCompleted, st.Status)
	}, 60*time.Second, 50*time.Millisecond)
	rs.Stop()
	b.requireExactlyOnce(t, p)
	completed := b.rec.OfType(events.RunCompleted)
	require.Len(t, completed, 1)
	require.Equal(t, string(job.SourceResume), completed[0].Trigger)
	require.Equal(t, res.RequestID, completed[0].RequestID, "the resumed run carries the request's id")
	require.Equal(t, int64(0), b.count(t, `select count(*) from run_requests`), "the request is forgotten once completed")
}
