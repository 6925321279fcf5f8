package trigger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/trigger"
)

type dispatchBundle struct {
	d      *trigger.Dispatcher
	runner *billrun.Runner
	rec    *events.Recorder
	locker *ownership.MemoryLocker
	// gate, when non-nil, holds every batch until it is closed or the run's
	// context ends.
	gate chan struct{}
}

// setupDispatcher wires a real bill-run Runner and Sweeper (Postgres schema
// of the test's own, in-memory locker) behind a Dispatcher.
func setupDispatcher(t *testing.T, gated bool) *dispatchBundle {
	t.Helper()
	pg := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := billrun.Seed(ctx, pg.Pool, billrun.SeedConfig{Subscribers: 50})
	require.NoError(t, err)
	_, err = msisdnreaper.Seed(ctx, pg.Pool, msisdnreaper.SeedSpec{Free: 5, StaleReserved: 7})
	require.NoError(t, err)

	b := &dispatchBundle{rec: &events.Recorder{}, locker: ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "r1", WaitTime: 50 * time.Millisecond})}
	t.Cleanup(func() { _ = b.locker.Close() })
	cfg := billrun.Config{ReplicaID: "r1", BatchSize: 10, Workers: 1}
	if gated {
		b.gate = make(chan struct{})
		cfg.BeforeBatch = func(ctx context.Context, _, _ int64) error {
			select {
			case <-b.gate:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	b.runner = billrun.New(pg.Pool, b.locker, b.rec, cfg)
	sweeper := msisdnreaper.NewSweeper(pg.Pool, b.locker, b.rec, msisdnreaper.Config{ReplicaID: "r1", Lease: 5 * time.Second})
	b.d = trigger.NewDispatcher(trigger.DispatcherConfig{BillRuns: b.runner, Sweeper: sweeper, Metrics: trigger.NewMetrics(nil), Replica: "r1"})
	return b
}

func cli(id string) job.Trigger { return job.Trigger{Source: job.SourceCLI, RequestID: id} }

func TestDispatcherBillRunAndSweep(t *testing.T) {
	t.Parallel()
	b := setupDispatcher(t, false)
	ctx := context.Background()

	_, err := b.d.BillRun(ctx, "2026-13", cli("bad"))
	require.ErrorIs(t, err, job.ErrBadInput)
	require.Empty(t, b.rec.Events(), "nothing ran for a bad period")

	res, err := b.d.BillRun(ctx, "2026-11", cli("one"))
	require.NoError(t, err)
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, "billrun:2026-11", res.Key)

	res, err = b.d.BillRun(ctx, "2026-11", cli("two"))
	require.NoError(t, err)
	require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome)
	require.Equal(t, "r1", res.Owner)

	sw := b.d.Sweep(ctx, cli("sweep"))
	require.Equal(t, job.OutcomeCompleted, sw.Outcome, sw.Error)
	require.EqualValues(t, 7, sw.Counts["freed"])

	b.d.Shutdown(ctx)
	b.d.Shutdown(ctx)
	_, err = b.d.BillRun(ctx, "2026-12", cli("late"))
	require.ErrorIs(t, err, trigger.ErrShuttingDown)
	require.Equal(t, job.OutcomeUnavailable, b.d.Sweep(ctx, cli("late")).Outcome)
}

func TestStartBillRunRunsInBackgroundAndShutdownWaits(t *testing.T) {
	t.Parallel()
	b := setupDispatcher(t, true)
	reqCtx, endRequest := context.WithCancel(context.Background())

	res, started, err := b.d.StartBillRun(reqCtx, "2026-11", job.Trigger{Source: job.SourceHTTP, RequestID: "h1"})
	require.NoError(t, err)
	require.True(t, started)
	require.Equal(t, "r1", res.Owner)
	require.Positive(t, res.Fence)
	endRequest() // the HTTP request ends; the run must go on

	// A second trigger meanwhile finds the period owned.
	res2, started2, err := b.d.StartBillRun(context.Background(), "2026-11", job.Trigger{Source: job.SourceHTTP, RequestID: "h2"})
	require.NoError(t, err)
	require.False(t, started2)
	require.Equal(t, job.OutcomeAlreadyOwned, res2.Outcome)

	close(b.gate)
	b.d.Shutdown(context.Background()) // waits for the run
	st, err := b.runner.Status(context.Background(), billrun.Period{Year: 2026, Month: 11})
	require.NoError(t, err)
	require.Equal(t, billrun.StatusCompleted, st.Status)
	require.Len(t, b.rec.OfType(events.RunCompleted), 1)
}

func TestShutdownCancelsRunsWhenItsBoundExpires(t *testing.T) {
	t.Parallel()
	b := setupDispatcher(t, true) // the gate is never opened: the run cannot finish

	_, started, err := b.d.StartBillRun(context.Background(), "2026-10", job.Trigger{Source: job.SourceHTTP, RequestID: "h1"})
	require.NoError(t, err)
	require.True(t, started)
	syncDone := make(chan job.Result, 1)
	go func() {
		res, _ := b.d.BillRun(context.Background(), "2026-09", job.Trigger{Source: job.SourceKafka, RequestID: "k1"})
		syncDone <- res
	}()
	// Wait until the Kafka-path run holds its lock too.
	waitEvents(t, b.rec, events.OwnershipAcquired, 2)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	b.d.Shutdown(ctx) // returns once the cancelled runs returned
	require.Equal(t, job.OutcomeLost, (<-syncDone).Outcome)
	for _, p := range []billrun.Period{{Year: 2026, Month: 10}, {Year: 2026, Month: 9}} {
		st, err := b.runner.Status(context.Background(), p)
		require.NoError(t, err)
		require.Equal(t, billrun.StatusInterrupted, st.Status, p.String())
	}
	require.Len(t, b.rec.OfType(events.OwnershipLost), 2)
	infos, err := b.locker.Locks(context.Background())
	require.NoError(t, err)
	require.Empty(t, infos, "locks released")
}
