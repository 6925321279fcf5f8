package billrun_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// ownServer is a migrated Postgres server of the test's own, with settings.
func ownServer(t *testing.T, settings ...string) (*testenv.PostgresServer, *pgxpool.Pool) {
	t.Helper()
	srv := testenv.StartPostgresServer(t, settings...)
	ctx := context.Background()
	pool, err := postgres.Connect(ctx, srv.DSN(), 8)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	m, err := migrate.New(pool)
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	return srv, pool
}

// A Postgres that loses acknowledged commits (synchronous_commit=off, the
// WAL writer asleep for 10s, restarted -m immediate mid-run, as a failover
// to an asynchronous replica would): the batches the run saw commit last
// are gone when it comes back, and the run goes on past them. It must not
// end COMPLETED with their subscribers unbilled: it reconciles, bills them
// under its fence, counts them as repaired, and every subscriber of the
// period is invoiced exactly once. (Before, it ended COMPLETED with them
// missing.)
func TestLostCommitsAreRepairedBeforeCompletion(t *testing.T) {
	t.Parallel()
	srv, pool := ownServer(t, "synchronous_commit=off", "wal_writer_delay=10s", "autovacuum=off")
	ctx := context.Background()
	seeded, err := billrun.Seed(ctx, pool, billrun.SeedConfig{Subscribers: 2000, SuspendedRatio: 0.1, Usage: true, Period: period})
	require.NoError(t, err)
	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a"})
	defer locker.Close()
	b := &bundle{pool: pool, locker: locker, rec: &events.Recorder{}}

	// Before batch 2: a checkpoint makes the claim and batch 1 durable.
	// Before batch 8: the worker waits while the server is restarted, with
	// batches 2-7 acknowledged and (some of) their WAL never written.
	var n atomic.Int64
	at8, release := make(chan struct{}), make(chan struct{})
	resume := sync.OnceFunc(func() { close(release) })
	t.Cleanup(resume)
	hook := func(ctx context.Context, _, _ int64) error {
		switch n.Add(1) {
		case 2:
			_, err := pool.Exec(ctx, `checkpoint`)
			return err
		case 8:
			close(at8)
			<-release
		}
		return nil
	}
	result := make(chan job.Result, 1)
	go func() {
		result <- b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 100, Workers: 1, MaxBatchAttempts: 12,
			RetryBackoff: 100 * time.Millisecond}, hook)).Run(ctx, period, trig())
	}()
	select {
	case <-at8:
	case res := <-result:
		t.Fatalf("the run ended before batch 8: %+v", res)
	}
	batchSubs := `select count(*), coalesce(sum(subscribers), 0) from bill_run_batches where period = $1`
	var batchesBefore, subsBefore int64
	require.NoError(t, pool.QueryRow(ctx, batchSubs, period.String()).Scan(&batchesBefore, &subsBefore))
	require.Equal(t, int64(7), batchesBefore)

	srv.Kill() // pg_ctl stop -m immediate
	srv.Start()
	var batchesAfter, subsAfter int64
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NoError(c, pool.QueryRow(ctx, batchSubs, period.String()).Scan(&batchesAfter, &subsAfter))
	}, 30*time.Second, 50*time.Millisecond)
	require.Less(t, batchesAfter, batchesBefore, "the immediate restart lost acknowledged batch commits")
	require.GreaterOrEqual(t, batchesAfter, int64(1), "batch 1 was made durable by the checkpoint")
	lost := subsBefore - subsAfter
	t.Logf("the restart lost %d of %d acknowledged batches (%d subscribers)", batchesBefore-batchesAfter, batchesBefore, lost)

	resume()
	res := <-result
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	b.requireExactlyOnce(t, period)
	require.Equal(t, lost, res.Counts["repaired"], "the lost batches' subscribers were repaired")
	require.Equal(t, seeded.Active, res.Counts["population"])
	require.Equal(t, seeded.Active, res.Counts["period_invoices_created"])

	// The completion committed with synchronous_commit on: an immediate
	// restart right after it loses neither the COMPLETED row nor anything
	// before it. (With the server's setting it lost the row.)
	srv.Kill()
	srv.Start()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		st, err := billrun.ReadStatus(ctx, pool, period)
		require.NoError(c, err)
		require.Equal(c, billrun.StatusCompleted, st.Status)
	}, 30*time.Second, 50*time.Millisecond)
	b.requireExactlyOnce(t, period)
}
