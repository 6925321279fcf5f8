package trigger_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/trigger"
)

type dispatchBundle struct {
	d      *trigger.Dispatcher
	w      *ownedtest.Widget
	rec    *events.Recorder
	locker *ownership.MemoryLocker
	// gate, when non-nil, holds every run until it is closed or the run's
	// context ends.
	gate chan struct{}
}

// setupDispatcher wires the widget kind behind the owned template and a
// Dispatcher (in-memory locker).
func setupDispatcher(t *testing.T, gatedRuns bool) *dispatchBundle {
	return setupCapped(t, gatedRuns, 0)
}

func setupCapped(t *testing.T, gatedRuns bool, maxRuns int) *dispatchBundle {
	t.Helper()
	b := &dispatchBundle{rec: &events.Recorder{}, w: &ownedtest.Widget{},
		locker: ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "r1", WaitTime: 50 * time.Millisecond})}
	t.Cleanup(func() { _ = b.locker.Close() })
	if gatedRuns {
		b.gate = make(chan struct{})
		b.w.Work = ownedtest.Gated(b.gate)
	}
	b.d = trigger.NewDispatcher(trigger.DispatcherConfig{Runner: widgetRunner(t, b.w, b.locker, b.rec), Metrics: trigger.NewMetrics(nil),
		MaxRunsInFlight: maxRuns})
	return b
}

func cli(id string) job.Trigger { return job.Trigger{Source: job.SourceCLI, RequestID: id} }

func TestDispatcherRunsAndRefusesAfterShutdown(t *testing.T) {
	t.Parallel()
	b := setupDispatcher(t, false)
	ctx := context.Background()

	res, err := b.d.Run(ctx, b.w.Kind(), b.w.Params(3), cli("one"))
	require.NoError(t, err)
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, "widget:3", res.Key)
	require.Equal(t, "r1", res.Owner)
	require.Equal(t, int64(3), res.Counts["n"])

	b.d.Shutdown(ctx)
	b.d.Shutdown(ctx)
	res, err = b.d.Run(ctx, b.w.Kind(), b.w.Params(4), cli("late"))
	require.ErrorIs(t, err, trigger.ErrShuttingDown)
	require.Equal(t, job.OutcomeUnavailable, res.Outcome, "not committed: another replica takes it")
	require.Equal(t, "widget:4", res.Key)
	_, started, err := b.d.Start(ctx, b.w.Kind(), b.w.Params(4), cli("late"))
	require.ErrorIs(t, err, trigger.ErrShuttingDown)
	require.False(t, started)
	require.Len(t, b.rec.OfType(events.OwnershipAcquired), 1, "nothing ran after Shutdown")
}

func TestStartRunsInBackgroundAndShutdownWaits(t *testing.T) {
	t.Parallel()
	b := setupDispatcher(t, true)
	reqCtx, endRequest := context.WithCancel(context.Background())

	res, started, err := b.d.Start(reqCtx, b.w.Kind(), b.w.Params(1), job.Trigger{Source: job.SourceHTTP, RequestID: "h1"})
	require.NoError(t, err)
	require.True(t, started)
	require.Equal(t, "r1", res.Owner)
	require.Positive(t, res.Fence)
	require.Empty(t, res.Outcome)
	endRequest() // the HTTP request ends; the run must go on

	// A second trigger meanwhile finds the key owned.
	res2, started2, err := b.d.Start(context.Background(), b.w.Kind(), b.w.Params(1), job.Trigger{Source: job.SourceHTTP, RequestID: "h2"})
	require.NoError(t, err)
	require.False(t, started2)
	require.Equal(t, job.OutcomeAlreadyOwned, res2.Outcome)
	require.Equal(t, "r1", res2.Owner)

	close(b.gate)
	b.d.Shutdown(context.Background()) // waits for the run
	require.Len(t, b.rec.OfType(events.RunCompleted), 1)
	require.Empty(t, b.rec.OfType(events.OwnershipLost), "the request's end did not cancel the run")
}

// At the cap, an HTTP trigger is refused before anything is locked, with
// the cap in the error; Kafka and cron triggers still run (they are bounded
// by partitions and schedules, and a refused Kafka record would only be
// redelivered). A slot freed admits HTTP again.
func TestCapRefusesHTTPOnly(t *testing.T) {
	t.Parallel()
	b := setupCapped(t, true, 2)
	ctx := context.Background()
	http := func(id string) job.Trigger { return job.Trigger{Source: job.SourceHTTP, RequestID: id} }

	for n := 1; n <= 2; n++ {
		_, started, err := b.d.Start(ctx, b.w.Kind(), b.w.Params(n), http("h"))
		require.NoError(t, err)
		require.True(t, started)
	}
	require.Equal(t, 2, b.d.InFlight())
	res, started, err := b.d.Start(ctx, b.w.Kind(), b.w.Params(3), http("h3"))
	require.ErrorIs(t, err, job.ErrAtCapacity)
	var ce *job.CapacityError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, job.CapacityError{Limit: 2, InFlight: 2}, *ce)
	require.False(t, started)
	require.Equal(t, "widget:3", res.Key)
	_, err = b.d.Run(ctx, b.w.Kind(), b.w.Params(4), http("h4"))
	require.ErrorIs(t, err, job.ErrAtCapacity, "synchronous HTTP runs count too")
	require.Len(t, b.rec.OfType(events.OwnershipAcquired), 2, "a refused trigger locks nothing")

	// Kafka is not refused at the cap.
	kafkaDone := make(chan job.Result, 1)
	go func() {
		res, _ := b.d.Run(ctx, b.w.Kind(), b.w.Params(5), job.Trigger{Source: job.SourceKafka, RequestID: "k5"})
		kafkaDone <- res
	}()
	waitEvents(t, b.rec, events.OwnershipAcquired, 3)
	require.Equal(t, 3, b.d.InFlight())

	close(b.gate) // every run finishes, and frees its slot
	require.Equal(t, job.OutcomeCompleted, (<-kafkaDone).Outcome)
	require.Eventually(t, func() bool { return b.d.InFlight() == 0 }, 10*time.Second, 5*time.Millisecond)
	_, started, err = b.d.Start(ctx, b.w.Kind(), b.w.Params(3), http("h3-again"))
	require.NoError(t, err)
	require.True(t, started)
	b.d.Shutdown(ctx)
	require.Zero(t, b.d.InFlight())
}

func TestShutdownCancelsRunsWhenItsBoundExpires(t *testing.T) {
	t.Parallel()
	b := setupDispatcher(t, true) // the gate is never opened: the runs cannot finish

	_, started, err := b.d.Start(context.Background(), b.w.Kind(), b.w.Params(10), job.Trigger{Source: job.SourceHTTP, RequestID: "h1"})
	require.NoError(t, err)
	require.True(t, started)
	syncDone := make(chan job.Result, 1)
	go func() {
		res, _ := b.d.Run(context.Background(), b.w.Kind(), b.w.Params(9), job.Trigger{Source: job.SourceKafka, RequestID: "k1"})
		syncDone <- res
	}()
	// Wait until the Kafka-path run holds its lock too.
	waitEvents(t, b.rec, events.OwnershipAcquired, 2)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	b.d.Shutdown(ctx) // returns once the cancelled runs returned
	res := <-syncDone
	require.Equal(t, job.OutcomeLost, res.Outcome)
	require.False(t, res.Outcome.Handled(), "a lost Kafka trigger is not committed")
	lost := b.rec.OfType(events.OwnershipLost)
	require.Len(t, lost, 2)
	for _, e := range lost {
		require.Equal(t, "shutdown", e.Extra["reason"])
	}
	infos, err := b.locker.Locks(context.Background())
	require.NoError(t, err)
	require.Empty(t, infos, "locks released")
}

func TestCronJobsAreTheScheduledKinds(t *testing.T) {
	t.Parallel()
	b := setupDispatcher(t, false)
	require.Empty(t, b.d.CronJobs(), "an empty schedule is no cron job")

	w := &ownedtest.Widget{Schedule: "@every 1h"}
	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "r1"})
	defer locker.Close()
	rec := &events.Recorder{}
	d := trigger.NewDispatcher(trigger.DispatcherConfig{Runner: widgetRunner(t, w, locker, rec)})
	defer d.Shutdown(context.Background())
	jobs := d.CronJobs()
	require.Len(t, jobs, 1)
	require.Equal(t, "widget", jobs[0].Name)
	require.Equal(t, "@every 1h", jobs[0].Spec)
	require.NoError(t, jobs[0].Run(context.Background(), job.Trigger{Source: job.SourceCron, RequestID: "tick-1"}, time.Now()))
	done := rec.OfType(events.RunCompleted)
	require.Len(t, done, 1)
	require.Equal(t, "widget:1", done[0].Key, "the tick's params come from the kind's Tick")
	require.Equal(t, "cron", done[0].Trigger)
}

// A tick's run that is neither finished nor durable (a transient failure of
// a kind without a resumer: nothing records it) is an error the cron retries;
// a permanent failure is finished with; a tick refused at shutdown says so.
func TestCronJobSaysWhetherTheTickIsDurable(t *testing.T) {
	t.Parallel()
	var fail atomic.Pointer[error]
	w := &ownedtest.Widget{Schedule: "@every 1h", Work: func(context.Context, *owned.Run, int) (owned.Report, error) {
		return owned.Report{}, *fail.Load()
	}}
	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "r1"})
	defer locker.Close()
	d := trigger.NewDispatcher(trigger.DispatcherConfig{Runner: widgetRunner(t, w, locker, nil)})
	defer d.Shutdown(context.Background())
	run := d.CronJobs()[0].Run
	tick := job.Trigger{Source: job.SourceCron, RequestID: "tick-1"}

	transient := owned.Retryable(errors.New("connection refused"))
	fail.Store(&transient)
	err := run(context.Background(), tick, time.Now())
	var nd *trigger.TickNotDurableError
	require.ErrorAs(t, err, &nd)
	require.Equal(t, job.OutcomeFailed, nd.Result.Outcome)
	require.True(t, nd.Result.Retryable)
	require.Contains(t, err.Error(), "widget:1 ended failed and is not recorded for the resumer: connection refused")

	permanent := errors.New("a constraint: trying again fails the same way")
	fail.Store(&permanent)
	require.NoError(t, run(context.Background(), tick, time.Now()), "a permanent failure is finished with")

	d.Shutdown(context.Background())
	require.ErrorIs(t, run(context.Background(), tick, time.Now()), trigger.ErrShuttingDown)
}

func TestScheduleLocation(t *testing.T) {
	t.Parallel()
	require.Equal(t, "Asia/Tokyo", trigger.ScheduleLocation("CRON_TZ=Asia/Tokyo 0 2 1 * *").String())
	require.Equal(t, "America/New_York", trigger.ScheduleLocation("TZ=America/New_York 0 2 1 * *").String())
	require.Equal(t, time.Local, trigger.ScheduleLocation("0 2 1 * *"))
	require.Equal(t, time.Local, trigger.ScheduleLocation("CRON_TZ=Nowhere/Atlantis 0 2 1 * *"))
}
