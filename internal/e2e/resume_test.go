package e2e

import (
	"context"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// The owner of a bill run SIGKILLed mid-run, for a run started by cron, by
// HTTP and by Kafka: another replica's resumer finds the period RUNNING
// with its lock expired and completes it, with exactly one invoice per
// ACTIVE subscriber, and no new trigger is sent (cron runs on the killed
// replica only; nobody calls the API again or produces a record).
func TestOwnerKilledMidRunIsResumedWithoutANewTrigger(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, period string
		// start starts the run on owner (cron: owner has the schedule).
		start func(t *testing.T, d *deployment, owner *replica, period string)
		// cron: the owner has a bill-run schedule that fires every second
		// (a tick while its run goes on is skipped).
		cron bool
	}{
		{name: "cron", period: billrun.PeriodOf(time.Now().UTC()).Previous().String(), cron: true,
			start: func(*testing.T, *deployment, *replica, string) {}},
		{name: "http", period: "2026-06", start: func(t *testing.T, d *deployment, owner *replica, period string) {
			code, _, body := owner.post(t, d.token, "/v1/billruns", `{"period":"`+period+`","request_id":"http-kill-me"}`)
			require.Equal(t, http.StatusAccepted, code, string(body))
		}},
		{name: "kafka", period: "2026-07", start: func(t *testing.T, d *deployment, _ *replica, period string) {
			d.produce(d.bills, period, billRunTrigger(period, "kafka-kill-me"))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := newDeployment(t, "")
			key := "billrun:" + c.period
			d.seedSubscribers(3000, c.period)
			// ~30 batches on 4 workers at 1 s each: the owner is killed
			// between its first and its last batch with seconds to spare on a
			// loaded machine (at 400 ms a starved test saw it COMPLETED first).
			slow := map[string]string{"COORDINATOR_TEST_BILLRUN_BATCH_DELAY": "1s"}
			args := []string{"--reaper-schedule="}
			survivor := d.start("r2", slow, "--reaper-schedule=")
			var owner *replica
			if c.cron {
				owner = d.start("r1", slow, append(args, "--billrun-schedule=CRON_TZ=UTC * * * * * *")...)
			} else {
				owner = d.start("r1", slow, args...)
			}
			d.waitGroupStable(2)
			c.start(t, d, owner, c.period)

			acquired := d.events.waitFor(t, 30*time.Second, 1, "ownership.acquired", ofType("ownership.acquired", key))
			if first := acquired[0].str("replica"); first != owner.id { // Kafka: whoever has the partition
				owner, survivor = survivor, owner
				require.Equal(t, owner.id, first)
			}
			ctx := context.Background()
			var total int
			require.NoError(t, d.pg.Pool.QueryRow(ctx, `select (count(*) + 99) / 100 from subscribers where status = 'ACTIVE'`).Scan(&total))
			var batches int
			require.EventuallyWithT(t, func(ct *assert.CollectT) {
				require.NoError(ct, d.pg.Pool.QueryRow(ctx, `select count(*) from bill_run_batches where period = $1`, c.period).Scan(&batches))
				require.Positive(ct, batches, "batches committed")
			}, 30*time.Second, 20*time.Millisecond)
			owner.kill()
			killedAt := time.Now()
			var status string
			require.NoError(t, d.pg.Pool.QueryRow(ctx, `select status from bill_runs where period = $1`, c.period).Scan(&status))
			require.Equal(t, "RUNNING", status, "killed mid-run")
			require.NoError(t, d.pg.Pool.QueryRow(ctx, `select count(*) from bill_run_batches where period = $1`, c.period).Scan(&batches))
			require.Less(t, batches, total, "killed before the last batch")

			done := d.events.waitFor(t, 90*time.Second, 1, "run.completed", ofType("run.completed", key))
			require.Equal(t, survivor.id, done[0].str("replica"))
			require.Greater(t, done[0].num("batches_skipped"), int64(0), "resumed from the committed batches")
			t.Logf("killed %s at %d of %d batches; %s completed %s after the kill (trigger %s)", owner.id, batches, total,
				survivor.id, done[0].Time.Sub(killedAt).Round(time.Millisecond), done[0].str("trigger"))
			d.requireInvoicesExact(c.period)
			require.NoError(t, d.pg.Pool.QueryRow(ctx, `select status from bill_runs where period = $1`, c.period).Scan(&status))
			require.Equal(t, "COMPLETED", status)
		})
	}
}

// c2s is the period of a bill-run lock key.
func c2s(key string) string { return key[len("billrun:"):] }

// A partition moved while its trigger ran: the new member answers
// already_owned (the old owner still runs it), then the old owner is shut
// down and its run ends lost (INTERRUPTED). Before, the new member had
// committed the trigger and nothing ever resumed the period; now its
// already_owned is recorded for the resumer before the commit, and every
// period completes, with exact invoices, without a new trigger.
func TestPartitionMovedMidRunThenOwnerLostIsResumed(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, "")
	periods := []string{"2026-01", "2026-02", "2026-03"} // one per partition of the trigger topic
	d.seedSubscribers(1500, periods[0])
	ctx := context.Background()
	for _, p := range periods[1:] {
		_, err := d.pg.Pool.Exec(ctx, `insert into usage_charges (subscriber_id, period, amount_cents)
select g, $2, 50 from generate_series(3, $1::bigint, 3) g`, 1500, p)
		require.NoError(t, err)
	}
	// One batch at a time at 1 s each: every run lasts well past the
	// rebalance (and its revoke wait) that moves a partition away.
	old := d.start("old", map[string]string{"COORDINATOR_TEST_BILLRUN_BATCH_DELAY": "1s", "COORDINATOR_BILLRUN_WORKERS": "1",
		"COORDINATOR_SHUTDOWN_TIMEOUT": "1s"}, "--reaper-schedule=")
	d.waitGroupStable(1)
	manual, err := kgo.NewClient(kgo.SeedBrokers(d.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	require.NoError(t, err)
	defer manual.Close()
	for i, p := range periods {
		rec := &kgo.Record{Topic: d.bills, Partition: int32(i), Key: []byte(p), Value: []byte(billRunTrigger(p, "move-"+p))}
		require.NoError(t, manual.ProduceSync(ctx, rec).FirstErr())
	}
	for _, p := range periods {
		d.events.waitFor(t, 30*time.Second, 1, "ownership.acquired "+p, ofType("ownership.acquired", "billrun:"+p))
	}

	// A second member joins: at least one partition moves to it, with its
	// run still going on the old owner.
	d.start("new", nil, "--reaper-schedule=")
	answered := d.events.waitFor(t, 60*time.Second, 1, "already_owned by the new member", func(e event) bool {
		return e.Type == "ownership.already_owned" && e.str("replica") == "new" && e.str("trigger") == "kafka"
	})
	moved := c2s(answered[0].Subject)
	t.Logf("%s moved to the new member, which answered already_owned (owner %s)", moved, answered[0].str("owner"))
	require.Equal(t, "old", answered[0].str("owner"))

	// The old owner shuts down with runs in flight: they end lost.
	require.NoError(t, old.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-old.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the old owner did not stop")
	}
	lost := d.events.waitFor(t, 10*time.Second, 1, "ownership.lost "+moved, ofType("ownership.lost", "billrun:"+moved))
	require.Equal(t, "shutdown", lost[0].str("reason"))

	for _, p := range periods {
		d.events.waitFor(t, 120*time.Second, 1, "run.completed "+p, ofType("run.completed", "billrun:"+p))
		d.requireInvoicesExact(p)
	}
	var incomplete int
	require.NoError(t, d.pg.Pool.QueryRow(ctx, `select count(*) from bill_runs where status <> 'COMPLETED'`).Scan(&incomplete))
	require.Zero(t, incomplete)
	require.Len(t, d.events.match(func(e event) bool { return e.Type == "run.completed" && e.Subject == "billrun:"+moved }), 1,
		fmt.Sprintf("%s completed once", moved))
}

// The bill-run cron tick meets Redis down: it answers unavailable (fail
// closed, nothing runs), but its request is recorded, and once Redis is back
// the resumer bills the period without waiting for the next tick (a month,
// in production).
func TestCronTickWhileRedisDownIsResumed(t *testing.T) {
	t.Parallel()
	rds := testenv.StartRedisServer(t)
	d := newDeployment(t, rds.URL())
	period := billrun.PeriodOf(time.Now().UTC()).Previous().String()
	key := "billrun:" + period
	d.seedSubscribers(600, period)
	testenv.CoordinatorBinary(t) // built (once per test binary) before the clock starts
	// One tick, 20 s from now (the spec fires once a day): time to start
	// the replica and stop Redis before it.
	at := time.Now().UTC().Add(20 * time.Second)
	spec := fmt.Sprintf("--billrun-schedule=CRON_TZ=UTC %d %d %d * * *", at.Second(), at.Minute(), at.Hour())
	d.start("r1", nil, "--reaper-schedule=", spec)
	rds.Stop()
	require.Greater(t, time.Until(at), 2*time.Second, "Redis stopped before the tick")

	unavailable := d.events.waitFor(t, 60*time.Second, 1, "ownership.unavailable", ofType("ownership.unavailable", key))
	require.Equal(t, "cron", unavailable[0].str("trigger"))
	require.Empty(t, d.events.match(ofType("ownership.acquired", key)), "fail closed: nothing ran")

	rds.Start()
	done := d.events.waitFor(t, 60*time.Second, 1, "run.completed", ofType("run.completed", key))
	require.Equal(t, "resume", done[0].str("trigger"))
	require.Equal(t, unavailable[0].str("request_id"), done[0].str("request_id"), "the tick's request, resumed")
	d.requireInvoicesExact(period)
}

// Postgres stopped mid-run for longer than the batches' retries (and the
// run's attempt to mark itself FAILED): the run ends failed, retryable, and
// its trigger (HTTP, answered 202 long ago) is not repeated. Once Postgres
// is back, the resumer of a replica resumes the period from its committed
// batches and completes it with exact invoices.
func TestPostgresDownLongerThanRetriesIsResumedByAReplica(t *testing.T) {
	t.Parallel()
	srv := testenv.StartPostgresServer(t)
	ctx := context.Background()
	pool, err := postgres.Connect(ctx, srv.DSN(), 8)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	m, err := migrate.New(pool)
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	d := newDeploymentOn(t, "", &testenv.PG{DSN: srv.DSN(), Pool: pool})
	const period = "2026-05"
	key := "billrun:" + period
	d.seedSubscribers(3000, period)
	slow := map[string]string{"COORDINATOR_TEST_BILLRUN_BATCH_DELAY": "300ms"}
	rs := d.startReplicas(2, slow, "--reaper-schedule=")
	code, _, body := rs[0].post(t, d.token, "/v1/billruns", `{"period":"`+period+`","request_id":"pg-down"}`)
	require.Equal(t, http.StatusAccepted, code, string(body))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var batches int
		require.NoError(c, pool.QueryRow(ctx, `select count(*) from bill_run_batches where period = $1`, period).Scan(&batches))
		require.Positive(c, batches, "batches committed")
	}, 30*time.Second, 20*time.Millisecond)

	srv.Stop()
	failed := d.events.waitFor(t, 90*time.Second, 1, "run.failed", ofType("run.failed", key))
	require.Equal(t, true, failed[0].Data["retryable"], "a lost connection is transient: %s", failed[0].str("error"))
	srv.Start()

	done := d.events.waitFor(t, 90*time.Second, 1, "run.completed", ofType("run.completed", key))
	require.Equal(t, "resume", done[0].str("trigger"))
	require.Equal(t, "pg-down", done[0].str("request_id"))
	require.Greater(t, done[0].num("batches_skipped"), int64(0), "resumed from the committed batches")
	d.requireInvoicesExact(period)
}
