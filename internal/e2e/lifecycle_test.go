package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/kinds"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/topics"
)

// SIGTERM while a bill run is in flight: within the shutdown bound the run
// finishes, its events reach Kafka, the lock is released and the process
// exits 0. With a bound shorter than the run, the run is interrupted at a
// batch boundary (INTERRUPTED, ownership.lost with reason shutdown), the
// lock is released all the same, and a later trigger completes it.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, "")
	d.seedSubscribers(2000, monthsAgo(7))
	slow := map[string]string{"COORDINATOR_TEST_BILLRUN_BATCH_DELAY": "200ms"} // ~18 batches / 4 workers: ~1 s
	ctx := context.Background()

	lockGone := func(period string) func() bool {
		return func() bool {
			n, err := d.redis.Exists(ctx, d.lockPrefix+":{billrun:"+period+"}:lock").Result()
			require.NoError(t, err)
			return n == 0
		}
	}
	status := func(period string) string {
		var s string
		require.NoError(t, d.pg.Pool.QueryRow(ctx, `select status from bill_runs where period = $1`, period).Scan(&s))
		return s
	}

	t.Run("in-flight run finishes within the bound", func(t *testing.T) {
		r := d.start("graceful", slow, "--reaper-schedule=")
		code, _, body := r.post(t, d.token, "/v1/billruns", `{"period":"`+monthsAgo(7)+`"}`)
		require.Equal(t, http.StatusAccepted, code, string(body))
		require.Equal(t, 0, r.terminate(t, 20*time.Second))
		require.Equal(t, "COMPLETED", status(monthsAgo(7)))
		require.True(t, lockGone(monthsAgo(7))(), "lock released")
		// Flushed before exit: the events are on Kafka although the process is gone.
		d.events.waitFor(t, 10*time.Second, 1, "run.completed", ofType("run.completed", "billrun:"+monthsAgo(7)))
		d.events.waitFor(t, 10*time.Second, 1, "ownership.released", ofType("ownership.released", "billrun:"+monthsAgo(7)))
		d.requireInvoicesExact(monthsAgo(7))
	})

	t.Run("run longer than the bound is interrupted and released", func(t *testing.T) {
		env := map[string]string{"COORDINATOR_TEST_BILLRUN_BATCH_DELAY": "1s", "COORDINATOR_SHUTDOWN_TIMEOUT": "1s"}
		r := d.start("hasty", env, "--reaper-schedule=")
		code, _, body := r.post(t, d.token, "/v1/billruns", `{"period":"`+monthsAgo(8)+`"}`)
		require.Equal(t, http.StatusAccepted, code, string(body))
		start := time.Now()
		require.Equal(t, 0, r.terminate(t, 20*time.Second))
		t.Logf("stopped in %s", time.Since(start).Round(time.Millisecond))
		require.Equal(t, "INTERRUPTED", status(monthsAgo(8)))
		require.True(t, lockGone(monthsAgo(8))(), "lock released on the way out, not left to expire")
		lost := d.events.waitFor(t, 10*time.Second, 1, "ownership.lost", ofType("ownership.lost", "billrun:"+monthsAgo(8)))
		require.Equal(t, "shutdown", lost[0].str("reason"))

		// A later trigger resumes and completes it.
		r2 := d.start("after", nil, "--reaper-schedule=")
		d.produce(d.bills, monthsAgo(8), billRunTrigger(monthsAgo(8), "resume"))
		d.events.waitFor(t, 30*time.Second, 1, "run.completed", ofType("run.completed", "billrun:"+monthsAgo(8)))
		d.requireInvoicesExact(monthsAgo(8))
		require.Equal(t, 0, r2.terminate(t, 20*time.Second))
	})

	t.Run("draining refuses new work; a second signal exits at once", func(t *testing.T) {
		env := map[string]string{"COORDINATOR_TEST_BILLRUN_BATCH_DELAY": "2s", "COORDINATOR_SHUTDOWN_TIMEOUT": "60s"}
		r := d.start("impatient", env, "--reaper-schedule=")
		code, _, body := r.post(t, d.token, "/v1/billruns", `{"period":"`+monthsAgo(9)+`"}`)
		require.Equal(t, http.StatusAccepted, code, string(body))
		require.NoError(t, r.cmd.Process.Signal(syscall.SIGTERM))
		require.Eventually(t, func() bool {
			for _, l := range r.logLines() {
				if strings.Contains(l, `"msg":"shutdown_started"`) {
					return true
				}
			}
			return false
		}, 10*time.Second, 20*time.Millisecond, "no shutdown_started line")
		// Draining: the run goes on, new work is refused, readiness fails.
		code, _, body = r.post(t, d.token, "/v1/billruns", `{"period":"`+monthsAgo(10)+`"}`)
		require.Equal(t, http.StatusServiceUnavailable, code, string(body))
		require.Contains(t, string(body), `"code":"SHUTTING_DOWN"`)
		code, body = r.get(t, "", "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code, string(body))
		require.Contains(t, string(body), "shutting down")
		require.NoError(t, r.cmd.Process.Signal(syscall.SIGTERM))
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Fatal("a second SIGTERM did not end the process")
		}
		require.Equal(t, 130, r.cmd.ProcessState.ExitCode())
	})
}

// One replica through its admin surface: readiness, metrics, locks, a
// synchronous sweep, and the cron bill run that bills the previous month.
func TestReplicaAdminSurface(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, "")
	prev := billrun.PeriodOf(time.Now().UTC()).Previous().String()
	d.seedSubscribers(300, prev)
	_, err := msisdnreaper.Seed(context.Background(), d.pg.Pool, msisdnreaper.SeedSpec{StaleReserved: 40, Free: 10})
	require.NoError(t, err)
	r := d.start("solo", map[string]string{"COORDINATOR_REAPER_MIN_HOLD": "10s"}, "--reaper-schedule=", "--billrun-schedule=CRON_TZ=UTC */2 * * * * *")

	code, body := r.get(t, "", "/readyz")
	require.Equal(t, http.StatusOK, code, string(body))
	code, body = r.get(t, d.token, "/v1/health")
	require.Equal(t, http.StatusOK, code, string(body))
	require.Contains(t, string(body), `"name":"redis","checked":true,"ok":true`)

	// The cron bill run bills the previous month, then finds it done.
	done := d.events.waitFor(t, 20*time.Second, 1, "run.completed", ofType("run.completed", "billrun:"+prev))
	require.Equal(t, "cron", done[0].str("trigger"))
	d.events.waitFor(t, 20*time.Second, 1, "run.already_completed", ofType("run.already_completed", "billrun:"+prev))
	d.requireInvoicesExact(prev)

	code, _, body = r.post(t, d.token, "/v1/msisdn-reaper/sweeps", "")
	require.Equal(t, http.StatusOK, code, string(body))
	var res struct {
		Outcome string
		Counts  map[string]int64
	}
	require.NoError(t, json.Unmarshal(body, &res))
	require.Equal(t, "completed", res.Outcome)
	require.EqualValues(t, 40, res.Counts["freed"])

	// The sweep's lock is held for its minimum hold: /v1/locks shows it.
	code, body = r.get(t, d.token, "/v1/locks")
	require.Equal(t, http.StatusOK, code, string(body))
	require.Contains(t, string(body), `"key":"msisdn-reaper:sweep","owner":"solo"`)

	code, body = r.get(t, "", "/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, series := range []string{"coordinator_lock_acquisitions_total", "coordinator_billrun_", "coordinator_reaper_",
		"coordinator_trigger_", "coordinator_events_buffered", "coordinator_http_requests_total", "go_goroutines", "process_resident_memory_bytes",
		// What is deployed, and the client libraries' pools and Kafka clients.
		`coordinator_build_info{go_version="go`, "coordinator_pgxpool_acquired_connections", "coordinator_pgxpool_acquires_total",
		"coordinator_redis_pool_connections", "coordinator_redis_pool_hits_total",
		`coordinator_kafka_connects_total{client_id="coordinator-solo"`, `coordinator_kafka_connects_total{client_id="coordinator-events-solo"`} {
		require.Contains(t, string(body), series)
	}

	// The status of the cron's bill run, with its progress complete.
	code, body = r.get(t, d.token, "/v1/billruns/"+prev)
	require.Equal(t, http.StatusOK, code, string(body))
	var st struct {
		Status   string
		Counts   map[string]int64
		Progress map[string]any
	}
	require.NoError(t, json.Unmarshal(body, &st), string(body))
	require.Equal(t, "COMPLETED", st.Status)
	require.Equal(t, float64(100), st.Progress["percent"], string(body))
	require.EqualValues(t, st.Counts["batches_committed"], st.Progress["batches_committed"])
	require.EqualValues(t, st.Counts["batches_committed"], st.Progress["batches_total"])

	code, body = r.get(t, "wrong", "/v1/locks")
	require.Equal(t, http.StatusUnauthorized, code, string(body))
	require.Contains(t, string(body), `"code":"UNAUTHORIZED"`)
	require.Equal(t, 0, r.terminate(t, 20*time.Second))
}

// With topic creation off, a replica whose topics do not exist starts; it
// stays ready (the topics are every replica's, like the brokers), and
// /v1/health and coordinator_dependency_up{dependency="kafka"} name every
// missing topic.
func TestHealthNamesMissingTopics(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, "")
	prefix := d.topicPfx + "-absent"
	r := d.start("picky", map[string]string{
		"COORDINATOR_KAFKA_CREATE_TOPICS": "false",
		"COORDINATOR_KAFKA_TOPIC_PREFIX":  prefix,
	}, "--reaper-schedule=")
	code, body := r.get(t, "", "/readyz")
	require.Equal(t, http.StatusOK, code, string(body))
	h := r.health(t, d.token) // the first round of checks ran before the start line
	pgOK, _, _ := h.dep("postgres")
	redisOK, _, _ := h.dep("redis")
	kafkaOK, checked, detail := h.dep("kafka")
	require.True(t, pgOK)
	require.True(t, redisOK)
	require.True(t, checked)
	require.False(t, kafkaOK)
	require.Equal(t, "degraded", h.Status)
	reg, err := kinds.Config{}.Registry()
	require.NoError(t, err)
	for _, topic := range topics.New(prefix, reg.Topics()...).All() {
		require.Contains(t, detail, topic, fmt.Sprintf("/v1/health names %s", topic))
	}
	code, body = r.get(t, "", "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(body), `coordinator_dependency_up{dependency="kafka"} 0`)
	require.Equal(t, 0, r.terminate(t, 20*time.Second))
}
