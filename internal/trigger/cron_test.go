package trigger_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/cronspec"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/trigger"
)

// A tick that panics is recovered, logged with its stack and counted; the
// replica (here: the test binary) survives and the next tick runs. Before,
// robfig/cron's default chain had no Recover and the panic ended the process.
func TestCronRecoversAPanickingTick(t *testing.T) {
	t.Parallel()
	var logs testenv.Buffer
	reg := prometheus.NewRegistry()
	var calls atomic.Int32
	next := make(chan struct{}, 10)
	c, err := trigger.NewCron(trigger.CronConfig{Replica: "r1", Log: slog.New(slog.NewJSONHandler(&logs, nil)), Metrics: trigger.NewMetrics(reg)},
		trigger.CronJob{Name: "boom", Spec: "* * * * * *", Run: func(context.Context, job.Trigger, time.Time) error {
			if calls.Add(1) == 1 {
				panic("a bug in a tick")
			}
			next <- struct{}{}
			return nil
		}})
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	defer c.Stop()
	select {
	case <-next:
	case <-time.After(30 * time.Second):
		t.Fatal("no tick ran after the panicking one")
	}
	require.Equal(t, float64(1), counterOf(t, reg, "coordinator_trigger_cron_panics_total"))
	out := logs.String()
	require.Contains(t, out, `"msg":"cron_tick_panicked"`)
	require.Contains(t, out, `"error":"a bug in a tick"`)
	require.Contains(t, out, `"job":"boom"`)
	require.True(t, strings.Contains(out, "cron_test.go"), "the stack is logged")
}

func TestLastTickInTheCatchUpWindow(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, time.December, 1, 5, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, spec string
		window     time.Duration
		want       time.Time // zero: no catch-up
	}{
		{"monthly tick 3h ago, 6h window", "CRON_TZ=UTC 0 2 1 * *", 6 * time.Hour, time.Date(2026, time.December, 1, 2, 0, 0, 0, time.UTC)},
		{"monthly tick outside a 2h window", "CRON_TZ=UTC 0 2 1 * *", 2 * time.Hour, time.Time{}},
		{"window 0 disables", "CRON_TZ=UTC 0 2 1 * *", 0, time.Time{}},
		{"the latest of several ticks", "CRON_TZ=UTC 0 * * * *", 6 * time.Hour, now},
		{"seconds field", "CRON_TZ=UTC 30 59 4 * * *", time.Hour, time.Date(2026, time.December, 1, 4, 59, 30, 0, time.UTC)},
		{"in the schedule's zone", "CRON_TZ=Asia/Tokyo 0 11 1 * *", 6 * time.Hour, time.Date(2026, time.December, 1, 2, 0, 0, 0, time.UTC)},
		{"@every has no fixed ticks", "@every 1m", 6 * time.Hour, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sched, err := cronspec.Parse(tc.spec)
			require.NoError(t, err)
			got, ok := trigger.LastTick(sched, now, tc.window)
			require.Equal(t, !tc.want.IsZero(), ok)
			if ok {
				require.True(t, tc.want.Equal(got), "got %s, want %s", got, tc.want)
			}
		})
	}
}

// billrunReplica is one replica's dispatcher over the real bill-run kind,
// Postgres and Redis, scheduled by spec.
func billrunReplica(t *testing.T, pg *testenv.PG, rd *testenv.RedisEnv, id, spec string, rec events.Emitter) *trigger.Dispatcher {
	t.Helper()
	client, err := redislock.NewClient(rd.URL, "single")
	require.NoError(t, err)
	l, err := redislock.New(client, redislock.Config{Prefix: rd.Prefix, Owner: id, WaitTime: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(); _ = client.Close() })
	reg, err := owned.NewRegistry(billrun.New(billrun.Config{BatchSize: 25, Schedule: spec}))
	require.NoError(t, err)
	r, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: pg.Pool, Locker: l}, Replica: id, Emit: rec})
	require.NoError(t, err)
	d := trigger.NewDispatcher(trigger.DispatcherConfig{Runner: r})
	t.Cleanup(func() { d.Shutdown(context.Background()) })
	return d
}

// A bill-run tick that fell while the replicas were down is run at start,
// through the lock and the claim: the first replica to start bills the
// month, the next finds it done, and nothing is billed twice.
func TestCronCatchesUpAMissedBillRunTickOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	_, err := billrun.Seed(ctx, pg.Pool, billrun.SeedConfig{Subscribers: 60})
	require.NoError(t, err)
	const spec = "CRON_TZ=UTC 0 2 1 * *"
	// Started 3 hours after the tick of 1 December, 02:00 UTC.
	start := func() time.Time { return time.Date(2026, time.December, 1, 5, 0, 0, 0, time.UTC) }
	rec := &events.Recorder{}
	startReplica := func(id string) *trigger.Cron {
		d := billrunReplica(t, pg, rd, id, spec, rec)
		reg := prometheus.NewRegistry()
		c, err := trigger.NewCron(trigger.CronConfig{Replica: id, Metrics: trigger.NewMetrics(reg), CatchUpWindow: 6 * time.Hour, Now: start},
			d.CronJobs()...)
		require.NoError(t, err)
		require.NoError(t, c.Start(ctx))
		t.Cleanup(c.Stop)
		return c
	}

	a := startReplica("replica-a")
	waitEvents(t, rec, events.RunCompleted, 1)
	a.Stop() // waits for the catch-up
	done := rec.OfType(events.RunCompleted)
	require.Len(t, done, 1)
	require.Equal(t, "billrun:2026-11", done[0].Key, "the missed tick of 1 December bills November")
	require.Equal(t, "cron", done[0].Trigger)
	require.Equal(t, "replica-a", done[0].Replica)

	b := startReplica("replica-b")
	waitEvents(t, rec, events.RunAlreadyCompleted, 1)
	b.Stop()
	require.Len(t, rec.OfType(events.RunCompleted), 1, "the catch-up of a tick already run bills nothing")
	var runs, invoices int
	require.NoError(t, pg.Pool.QueryRow(ctx, `select count(*) from bill_runs`).Scan(&runs))
	require.NoError(t, pg.Pool.QueryRow(ctx, `select count(*) from invoices`).Scan(&invoices))
	require.Equal(t, 1, runs)
	require.Equal(t, 60, invoices)
}

// CronConfig.Jitter is the jitter of every job that sets none
// (COORDINATOR_CRON_JITTER); a job's own Jitter wins.
func TestCronJitterDefaultsToTheConfiguredOne(t *testing.T) {
	t.Parallel()
	var logs testenv.Buffer
	noop := func(context.Context, job.Trigger, time.Time) error { return nil }
	c, err := trigger.NewCron(trigger.CronConfig{Log: slog.New(slog.NewJSONHandler(&logs, nil)), Jitter: 2 * time.Second},
		trigger.CronJob{Name: "plain", Spec: "@every 1h", Run: noop},
		trigger.CronJob{Name: "own", Spec: "@every 1h", Jitter: 5 * time.Second, Run: noop})
	require.NoError(t, err)
	c.Stop()
	out := logs.String()
	require.Contains(t, out, `"job":"plain","spec":"@every 1h","jitter":2000000000`)
	require.Contains(t, out, `"job":"own","spec":"@every 1h","jitter":5000000000`)
}

// Replicas that start together all catch the missed tick up at once: the
// lock lets one bill the month, the others answer already_owned (or, once
// it is done, already_completed).
func TestCronCatchUpOnReplicasStartingTogetherBillsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	_, err := billrun.Seed(ctx, pg.Pool, billrun.SeedConfig{Subscribers: 200})
	require.NoError(t, err)
	const spec = "CRON_TZ=UTC 0 2 1 * *"
	start := func() time.Time { return time.Date(2026, time.November, 1, 4, 0, 0, 0, time.UTC) }
	rec := &events.Recorder{}
	ids := []string{"replica-a", "replica-b", "replica-c"}
	var crons []*trigger.Cron
	for _, id := range ids {
		d := billrunReplica(t, pg, rd, id, spec, rec)
		c, err := trigger.NewCron(trigger.CronConfig{Replica: id, CatchUpWindow: 6 * time.Hour, Now: start}, d.CronJobs()...)
		require.NoError(t, err)
		crons = append(crons, c)
	}
	for _, c := range crons {
		require.NoError(t, c.Start(ctx))
		t.Cleanup(c.Stop)
	}
	require.Eventually(t, func() bool {
		return len(rec.OfType(events.RunCompleted))+len(rec.OfType(events.OwnershipAlreadyOwned))+
			len(rec.OfType(events.RunAlreadyCompleted)) >= len(ids)
	}, 60*time.Second, 10*time.Millisecond, "every replica's catch-up has an outcome")
	for _, c := range crons {
		c.Stop()
	}
	done := rec.OfType(events.RunCompleted)
	require.Len(t, done, 1, "one replica bills the missed month")
	require.Equal(t, "billrun:2026-10", done[0].Key)
	var invoices int
	require.NoError(t, pg.Pool.QueryRow(ctx, `select count(*) from invoices`).Scan(&invoices))
	require.Equal(t, 200, invoices)
}

// A tick whose work is neither done nor durable is run again, the same
// trigger each time, with backoff, until it is; then it is logged durable.
func TestCronRetriesATickUntilItIsDurable(t *testing.T) {
	t.Parallel()
	var logs testenv.Buffer
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	var seen []string
	done := make(chan struct{})
	run := func(_ context.Context, tr job.Trigger, _ time.Time) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, tr.RequestID)
		if len(seen) < 4 {
			return errors.New("not recorded: Postgres is down")
		}
		close(done)
		return nil
	}
	// The monthly tick of 1 December, caught up at start: the next one is
	// a month away.
	c, err := trigger.NewCron(trigger.CronConfig{Replica: "r1", Log: slog.New(slog.NewJSONHandler(&logs, nil)),
		Metrics: trigger.NewMetrics(reg), CatchUpWindow: 6 * time.Hour, RetryBackoff: 10 * time.Millisecond,
		Now: func() time.Time { return time.Date(2026, time.December, 1, 5, 0, 0, 0, time.UTC) }},
		trigger.CronJob{Name: "monthly", Spec: "CRON_TZ=UTC 0 2 1 * *", Run: run})
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	defer c.Stop()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the tick was not retried until it was durable")
	}
	c.Stop()
	mu.Lock()
	require.Len(t, seen, 4)
	for _, id := range seen {
		require.Equal(t, seen[0], id, "the same trigger each time")
	}
	mu.Unlock()
	require.Equal(t, float64(3), counterOf(t, reg, "coordinator_trigger_cron_retries_total"))
	require.Zero(t, counterOf(t, reg, "coordinator_trigger_cron_ticks_dropped_total"))
	out := logs.String()
	require.Equal(t, 3, strings.Count(out, `"msg":"cron_tick_retry"`))
	require.Contains(t, out, `"msg":"cron_tick_durable"`)
}

// The retry of a tick is bounded by the schedule's next tick: it is given up
// (cron_tick_dropped, reason next_tick, counted) in time for the next tick to
// run, which is never skipped as "still running".
func TestCronGivesATickUpBeforeTheNextTick(t *testing.T) {
	t.Parallel()
	var logs testenv.Buffer
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	attempts := map[string]int{}
	run := func(_ context.Context, tr job.Trigger, _ time.Time) error {
		mu.Lock()
		defer mu.Unlock()
		attempts[tr.RequestID]++
		return errors.New("never durable")
	}
	c, err := trigger.NewCron(trigger.CronConfig{Replica: "r1", Log: slog.New(slog.NewJSONHandler(&logs, nil)),
		Metrics: trigger.NewMetrics(reg), RetryBackoff: 100 * time.Millisecond},
		trigger.CronJob{Name: "every3s", Spec: "*/3 * * * * *", Run: run})
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	defer c.Stop()
	require.Eventually(t, func() bool {
		return counterOf(t, reg, "coordinator_trigger_cron_ticks_dropped_total") >= 2
	}, 60*time.Second, 10*time.Millisecond)
	c.Stop()
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(attempts), 2, "two ticks")
	for id, n := range attempts {
		require.Greaterf(t, n, 1, "tick %s was retried", id)
	}
	out := logs.String()
	require.NotContains(t, out, "cron_tick_skipped", "the retry ended before the next tick")
	require.Contains(t, out, `"msg":"cron_tick_dropped"`)
	require.Contains(t, out, `"reason":"next_tick"`)
}

// Stopping the cron ends a tick's retry: it is dropped with reason shutdown.
func TestCronStopEndsATicksRetry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	tried := make(chan struct{}, 1)
	c, err := trigger.NewCron(trigger.CronConfig{Replica: "r1", Metrics: trigger.NewMetrics(reg), CatchUpWindow: 6 * time.Hour,
		RetryBackoff: time.Hour, Now: func() time.Time { return time.Date(2026, time.December, 1, 5, 0, 0, 0, time.UTC) }},
		trigger.CronJob{Name: "monthly", Spec: "CRON_TZ=UTC 0 2 1 * *", Run: func(context.Context, job.Trigger, time.Time) error {
			select {
			case tried <- struct{}{}:
			default:
			}
			return errors.New("never durable")
		}})
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	<-tried
	c.Stop() // does not wait out the hour's backoff
	require.Equal(t, float64(1), labelledCounter(t, reg, "coordinator_trigger_cron_ticks_dropped_total",
		map[string]string{"job": "monthly", "reason": "shutdown"}))
}

// A tick given up whose next tick does the same work (the same key: every
// reaper sweep) is superseded, not dropped: logged, not counted, no page.
func TestCronTickSupersededByTheNextIsNotDropped(t *testing.T) {
	t.Parallel()
	var logs testenv.Buffer
	reg := prometheus.NewRegistry()
	c, err := trigger.NewCron(trigger.CronConfig{Replica: "r1", Log: slog.New(slog.NewJSONHandler(&logs, nil)),
		Metrics: trigger.NewMetrics(reg), RetryBackoff: 100 * time.Millisecond},
		trigger.CronJob{Name: "sweep", Spec: "*/2 * * * * *",
			Run: func(context.Context, job.Trigger, time.Time) error { return errors.New("lock backend unavailable") },
			Key: func(time.Time) (string, error) { return "msisdn-reaper:sweep", nil }})
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	defer c.Stop()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), `"msg":"cron_tick_superseded"`) },
		30*time.Second, 10*time.Millisecond)
	c.Stop()
	require.Zero(t, counterOf(t, reg, "coordinator_trigger_cron_ticks_dropped_total"))
	require.NotContains(t, logs.String(), `"msg":"cron_tick_dropped"`)
}
