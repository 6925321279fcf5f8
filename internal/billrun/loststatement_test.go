package billrun_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// The batch is one statement, so a client whose
// connection breaks mid-statement does not roll the batch back: the server
// runs it to the end and commits it. The retry's sqlCommittedBatch runs
// while the first statement is still in flight, finds nothing, sends the
// batch again, and that one fails on bill_run_batches_pkey (23505) once the
// first commits: reported as an escaped unique violation
// (billrun.invoice_conflict, unique_violations) although nothing is wrong;
// on a run's last attempt it failed the run. The retry now looks for its
// record again when its own record's key is what conflicted.
func TestLostStatementRetryIsNotAUniqueViolation(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx := context.Background()
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a", WaitTime: 50 * time.Millisecond, WatchdogTimeout: 3 * time.Second})
	t.Cleanup(func() { _ = l.Close() })
	b := &bundle{pool: pg.Pool, locker: l, rec: &events.Recorder{}}
	seeded := b.seed(t, billrun.SeedConfig{Subscribers: 100})
	require.Positive(t, seeded.Active)

	// The run's own pool: every connection's socket by backend pid.
	var mu sync.Mutex
	socks := map[uint32]net.Conn{}
	cfg, err := pgxpool.ParseConfig(pg.DSN)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = "lost-statement"
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		mu.Lock()
		socks[c.PgConn().PID()] = c.PgConn().Conn()
		mu.Unlock()
		return nil
	}
	// A partition: while it lasts no new connection reaches the server (pgx's
	// CancelRequest for the broken connection among them).
	var partitioned atomic.Bool
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if partitioned.Load() {
			return nil, errors.New("partitioned")
		}
		return dial(ctx, network, addr)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()

	// An uncommitted invoice of an active subscriber: the batch takes its
	// FOR SHARE, inserts, and waits on this row.
	var sub int64
	require.NoError(t, b.pool.QueryRow(ctx, `select max(id) from subscribers where status = 'ACTIVE'`).Scan(&sub))
	blocker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(ctx) }()
	_, err = blocker.Exec(ctx, `insert into invoices (subscriber_id, period, amount_cents) values ($1, $2, 1)`, sub, period.String())
	require.NoError(t, err)

	r := newRunner(pool, b.locker, "", b.rec, billrun.Config{BatchSize: 1000, Workers: 1, MaxBatchAttempts: 10, RetryBackoff: 50 * time.Millisecond})
	result := make(chan job.Result, 1)
	go func() { result <- r.Run(ctx, period, trig()) }()

	waiting := func(c *assert.CollectT, n int) []uint32 {
		rows, err := b.pool.Query(ctx, `select pid from pg_stat_activity where application_name = 'lost-statement' and wait_event_type = 'Lock' and query ilike '%pop as materialized%'`)
		require.NoError(c, err)
		pids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
		require.NoError(c, err)
		require.Len(c, pids, n)
		return pids
	}
	var first uint32
	require.EventuallyWithT(t, func(c *assert.CollectT) { first = waiting(c, 1)[0] }, 30*time.Second, 10*time.Millisecond)
	// The client side of the in-flight batch breaks (a network fault); the backend goes on.
	partitioned.Store(true)
	t.Cleanup(func() { partitioned.Store(false) })
	mu.Lock()
	sock := socks[first]
	mu.Unlock()
	require.NoError(t, sock.Close())
	time.Sleep(300 * time.Millisecond) // the partition's length: the fault under test, not a wait for a state
	partitioned.Store(false)
	// The retry's statement arrives while the first is still running.
	require.EventuallyWithT(t, func(c *assert.CollectT) { waiting(c, 2) }, 30*time.Second, 10*time.Millisecond)
	require.NoError(t, blocker.Rollback(ctx))

	var res job.Result
	select {
	case res = <-result:
	case <-time.After(2 * time.Minute):
		t.Fatal("the run did not end")
	}
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(1), b.count(t, `select count(*) from bill_run_batches`))
	require.Equal(t, seeded.Active, res.Counts["subscribers"], "counted once")
	for _, e := range b.rec.OfType(events.BillrunInvoiceConflict) {
		t.Logf("invoice_conflict event: %v", e.Extra)
	}
	require.Zero(t, res.Counts["unique_violations"], "a lost statement's retry is not an escaped unique violation")
}
