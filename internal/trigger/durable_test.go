package trigger_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/topics"
	"github.com/telco-platform/coordinator/internal/trigger"
)

// A bill-run cron tick that meets Postgres down fails transiently (its claim
// cannot be written) and its request cannot be recorded for the resumer
// either. The tick is retried with backoff until Postgres is back, then it
// runs: the period is billed without waiting for next month's tick. Before,
// the dispatcher dropped the tick's result (run.failed retryable=true,
// run_request_record_failed, trigger_dispatched deferred=false) and nothing
// ever billed the month.
func TestCronTickWhilePostgresDownIsRetriedUntilItRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testenv.StartPostgresServer(t)
	pool, err := postgres.Connect(ctx, srv.DSN(), 8)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	m, err := migrate.New(pool)
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	_, err = billrun.Seed(ctx, pool, billrun.SeedConfig{Subscribers: 60})
	require.NoError(t, err)

	rd := testenv.Redis(t)
	client, err := redislock.NewClient(rd.URL, "single")
	require.NoError(t, err)
	l, err := redislock.New(client, redislock.Config{Prefix: rd.Prefix, Owner: "replica-a", WaitTime: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(); _ = client.Close() })
	const spec = "CRON_TZ=UTC 0 2 1 * *"
	reg, err := owned.NewRegistry(billrun.New(billrun.Config{BatchSize: 25, MaxBatchAttempts: 2, RetryBackoff: 20 * time.Millisecond, Schedule: spec}))
	require.NoError(t, err)
	var logs testenv.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	rec := &events.Recorder{}
	r, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: pool, Locker: l, Log: log}, Replica: "replica-a", Emit: rec})
	require.NoError(t, err)
	d := trigger.NewDispatcher(trigger.DispatcherConfig{Runner: r, Log: log})
	t.Cleanup(func() { d.Shutdown(context.Background()) })

	srv.Stop() // Postgres is down when the tick comes
	// The tick of 1 December 02:00 UTC, caught up at start 3 hours later.
	start := func() time.Time { return time.Date(2026, time.December, 1, 5, 0, 0, 0, time.UTC) }
	c, err := trigger.NewCron(trigger.CronConfig{Replica: "replica-a", Log: log, Metrics: trigger.NewMetrics(prometheus.NewRegistry()),
		CatchUpWindow: 6 * time.Hour, Now: start}, d.CronJobs()...)
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(c.Stop)

	waitEvents(t, rec, events.RunFailed, 1)
	failed := rec.OfType(events.RunFailed)[0]
	require.Equal(t, "billrun:2026-11", failed.Key)
	require.Equal(t, true, failed.Extra["retryable"], "Postgres down is transient: %v", failed.Extra["error"])
	require.Empty(t, rec.OfType(events.RunCompleted))
	srv.Start()

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.Len(c, rec.OfType(events.RunCompleted), 1, "the tick ran once Postgres was back")
	}, 60*time.Second, 20*time.Millisecond)
	c.Stop()
	done := rec.OfType(events.RunCompleted)[0]
	require.Equal(t, "billrun:2026-11", done.Key)
	require.Equal(t, "cron", done.Trigger)
	require.Equal(t, failed.RequestID, done.RequestID, "the same tick, retried")
	var invoices int
	require.NoError(t, pool.QueryRow(ctx, `select count(*) from invoices where period = '2026-11'`).Scan(&invoices))
	require.Equal(t, 60, invoices)
}

// labelledCounter is the value of the counter name with exactly labels (-1:
// no such series).
func labelledCounter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// The series the alerts read exist at 0 from the start: for every trigger
// topic its retries, DLQ write failures and a rejection for each reason its
// kind can give (shared ones, the kind's own, batch_too_large); for every
// scheduled job its panics and dropped ticks. A counter that first appears
// at 1 has no increase(), so CoordinatorTriggerDLQGrowing,
// CoordinatorCronTickPanicked and CoordinatorCronTickDropped would miss the
// first occurrence after a replica starts.
func TestAlertedSeriesExistAtZeroFromTheStart(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := trigger.NewMetrics(reg)
	kinds, err := owned.NewRegistry(testBills())
	require.NoError(t, err)
	names := topics.New("p", kinds.Topics()...)
	_, err = trigger.NewKafkaConsumer(trigger.KafkaConfig{Brokers: []string{"127.0.0.1:1"}, Group: "g", Kinds: kinds, Topics: names,
		Replica: "r1"}, newFake(nil), nil, nil, m)
	require.NoError(t, err)
	c, err := trigger.NewCron(trigger.CronConfig{Replica: "r1", Metrics: m},
		trigger.CronJob{Name: "billrun", Spec: "@every 1h", Run: func(context.Context, job.Trigger, time.Time) error { return nil }})
	require.NoError(t, err)
	c.Stop()

	topic := names.Topic(billrun.Topic)
	reasons := append(owned.SharedRejectReasons(), trigger.ReasonBatchTooLarge, billrun.ReasonPeriodNotClosed, billrun.ReasonBadPeriod)
	for _, reason := range reasons {
		require.Zerof(t, labelledCounter(t, reg, "coordinator_trigger_rejected_total", map[string]string{"topic": topic, "reason": reason}),
			"rejected{%s}", reason)
	}
	for _, name := range []string{"coordinator_trigger_retries_total", "coordinator_trigger_dlq_write_failures_total"} {
		require.Zero(t, labelledCounter(t, reg, name, map[string]string{"topic": topic}), name)
	}
	for _, name := range []string{"coordinator_trigger_cron_panics_total", "coordinator_trigger_cron_retries_total"} {
		require.Zero(t, labelledCounter(t, reg, name, map[string]string{"job": "billrun"}), name)
	}
	for _, reason := range []string{trigger.DropNextTick, trigger.DropShutdown} {
		require.Zero(t, labelledCounter(t, reg, "coordinator_trigger_cron_ticks_dropped_total",
			map[string]string{"job": "billrun", "reason": reason}))
	}
}

// Each month's bill-run tick is work of its own (its own period's lock key),
// so one given up is dropped and pages; the widget's every tick is the same.
func TestCronJobKeysTellEachMonthApart(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	d := billrunReplica(t, pg, rd, "replica-a", "CRON_TZ=UTC 0 2 1 * *", nil)
	j := d.CronJobs()[0]
	dec, err := j.Key(time.Date(2026, time.December, 1, 2, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	jan, err := j.Key(time.Date(2027, time.January, 1, 2, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	require.Equal(t, "billrun:2026-11", dec)
	require.Equal(t, "billrun:2026-12", jan)
}
