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
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// logSignal closes seen when the runner logs msg with attribute key = value.
type logSignal struct {
	msg, key, value string
	once            sync.Once
	seen            chan struct{}
}

func newLogSignal(msg, key, value string) *logSignal {
	return &logSignal{msg: msg, key: key, value: value, seen: make(chan struct{})}
}

func (h *logSignal) Enabled(context.Context, slog.Level) bool { return true }
func (h *logSignal) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logSignal) WithGroup(string) slog.Handler            { return h }
func (h *logSignal) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == h.key && a.Value.String() == h.value {
				h.once.Do(func() { close(h.seen) })
				return false
			}
			return true
		})
	}
	return nil
}

// Postgres restarted mid-run: the failed batches are retried with backoff
// and the run completes; every ACTIVE subscriber is invoiced exactly once.
// Postgres down longer than the retries: the run is FAILED with last_error,
// and a later run resumes from the committed batches.
func TestPostgresRestartMidRun(t *testing.T) {
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
	seeded, err := billrun.Seed(ctx, pool, billrun.SeedConfig{Subscribers: 2000, SuspendedRatio: 0.1, Usage: true, Period: period})
	require.NoError(t, err)

	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a"})
	defer locker.Close()
	b := &bundle{pool: pool, locker: locker, rec: &events.Recorder{}}

	// pauseAt4 is a BeforeBatch hook that holds the worker before batch 4
	// until resume is called (at the latest when the test ends).
	pauseAt4 := func(t *testing.T) (hook func(context.Context, int64, int64) error, at4 chan struct{}, resume func()) {
		var n atomic.Int64
		at4, release := make(chan struct{}), make(chan struct{})
		resume = sync.OnceFunc(func() { close(release) })
		t.Cleanup(resume)
		hook = func(ctx context.Context, _, _ int64) error {
			if n.Add(1) == 4 {
				close(at4)
				<-release
			}
			return nil
		}
		return hook, at4, resume
	}
	// run starts the run and waits for its worker to reach batch 4.
	run := func(t *testing.T, p billrun.Period, cfg billrun.Config, at4 chan struct{}) chan job.Result {
		t.Helper()
		result := make(chan job.Result, 1)
		go func() { result <- b.runner(cfg).Run(ctx, p, trig()) }()
		select {
		case <-at4:
		case res := <-result:
			t.Fatalf("the run ended before batch 4: %+v", res)
		}
		return result
	}

	t.Run("restart is retried", func(t *testing.T) {
		hook, at4, resume := pauseAt4(t)
		// Many tries, up to 3.2s apart: the batch outlives the restart.
		result := run(t, period, billrun.WithBeforeBatch(billrun.Config{BatchSize: 100, Workers: 1, MaxBatchAttempts: 12,
			RetryBackoff: 100 * time.Millisecond}, hook), at4)
		// Batch 4's fence check (FOR SHARE on the bill_runs row) waits for
		// this lock, so the restart meets a batch transaction in flight.
		blocker, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = blocker.Rollback(ctx) }()
		_, err = blocker.Exec(ctx, `select 1 from bill_runs where period = $1 for update`, period.String())
		require.NoError(t, err)
		resume()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			var waiting int
			require.NoError(c, pool.QueryRow(ctx, `select count(*) from pg_stat_activity
				where pid <> pg_backend_pid() and wait_event_type = 'Lock' and query ilike '%for share%'`).Scan(&waiting))
			require.Equal(c, 1, waiting, "batch 4 waiting for the bill_runs row")
		}, 30*time.Second, 10*time.Millisecond)
		srv.Restart()
		res := <-result
		require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
		require.Positive(t, res.Counts["batches_retried"], "a batch met the restart")
		require.Equal(t, seeded.Active, res.Counts["invoices_created"])
		b.requireExactlyOnce(t, period)
	})

	t.Run("down too long fails, a later run resumes", func(t *testing.T) {
		p := period.Previous()
		hook, at4, resume := pauseAt4(t)
		// The outage lasts until the run, its batch's tries spent, retries
		// marking itself FAILED (which it does for up to 15s).
		finishing := newLogSignal("billrun_retry", "step", "finish")
		result := run(t, p, billrun.WithBeforeBatch(billrun.Config{BatchSize: 100, Workers: 1, MaxBatchAttempts: 2,
			RetryBackoff: 50 * time.Millisecond, Logger: slog.New(finishing)}, hook), at4)
		srv.Stop()
		resume()
		select {
		case <-finishing.seen:
		case res := <-result:
			t.Fatalf("the run ended while Postgres was down: %+v", res)
		}
		srv.Start()
		res := <-result
		require.Equal(t, job.OutcomeFailed, res.Outcome)
		require.Equal(t, int64(3), res.Counts["batches_committed"])
		require.Len(t, b.rec.OfType(events.RunFailed), 1)
		st, err := b.runner(billrun.Config{}).Status(ctx, p)
		require.NoError(t, err)
		require.Equal(t, billrun.StatusFailed, st.Status)
		require.NotEmpty(t, st.LastError) // the batch's or the planner's error, whichever met the outage first
		require.Equal(t, res.Error, st.LastError)

		res = b.runner(billrun.Config{BatchSize: 100, Workers: 2}).Run(ctx, p, trig())
		require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
		require.Equal(t, int64(3), res.Counts["batches_skipped"])
		require.Equal(t, int64(2), res.Fence)
		b.requireExactlyOnce(t, p)
	})
}
