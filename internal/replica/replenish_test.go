package replica_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/kinds"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/replenish"
	"github.com/telco-platform/coordinator/internal/replica"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/topics"
)

// deployment is one replica of the coordinator, in this process, on the
// real Redis, Postgres and Kafka (a schema, key prefix, topic prefix and
// group of its own), with every event it emits recorded.
type deployment struct {
	pg      *testenv.PG
	env     map[string]string
	brokers []string
	names   topics.Names
	rec     *events.Recorder
	http    string
	token   string
	rd      *testenv.RedisEnv
}

func newDeployment(t *testing.T) *deployment {
	t.Helper()
	pg, rd, k := testenv.Postgres(t), testenv.Redis(t), testenv.Kafka(t)
	reg, err := kinds.Config{}.Registry()
	require.NoError(t, err)
	d := &deployment{pg: pg, rd: rd, brokers: k.Brokers, names: topics.New(k.Suffix, reg.Topics()...),
		rec: &events.Recorder{}, token: testenv.AdminToken()}
	d.env = map[string]string{
		"COORDINATOR_DATABASE_URL":       pg.DSN,
		"COORDINATOR_LOCK_REDIS_URL":     rd.URL,
		"COORDINATOR_LOCK_KEY_PREFIX":    rd.Prefix,
		"COORDINATOR_LOCK_WAIT_TIME":     "200ms",
		"COORDINATOR_KAFKA_BROKERS":      strings.Join(k.Brokers, ","),
		"COORDINATOR_KAFKA_TOPIC_PREFIX": k.Suffix,
		"COORDINATOR_KAFKA_GROUP":        "g_" + k.Suffix,
		"COORDINATOR_REPLICA_ID":         "replica-a",
		"COORDINATOR_HTTP_ADDR":          "127.0.0.1:0",
		"COORDINATOR_ADMIN_TOKEN":        d.token,
		"COORDINATOR_REAPER_SCHEDULE":    "",
		"COORDINATOR_SHUTDOWN_TIMEOUT":   "10s",
	}
	cfg, _, err := config.Load("test", nil, func(k string) string { return d.env[k] },
		config.WithLookup(func(k string) (string, bool) { v, ok := d.env[k]; return v, ok })) // the reaper off
	require.NoError(t, err)
	r := replica.New(replica.Config{Config: cfg, OpenLocker: openLocker, Emit: d.rec,
		Log: slog.New(slog.DiscardHandler)})
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() {
		r.Stop()
		adm, err := topics.Dial(k.Brokers)
		if err != nil {
			return
		}
		defer adm.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_, _ = adm.DeleteGroup(ctx, "g_"+k.Suffix)
		_, _ = adm.DeleteTopics(ctx, d.names.All()...)
	})
	d.http = "http://" + r.HTTPAddr().String()
	return d
}

// openLocker is the replica's Locker on the test Redis.
func openLocker(_ context.Context, cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (ownership.Locker, error) {
	c, err := redislock.NewClient(cfg.Lock.RedisURL, cfg.Lock.RedisMode)
	if err != nil {
		return nil, err
	}
	l, err := redislock.New(c, redislock.Config{Prefix: cfg.Lock.KeyPrefix, Owner: cfg.ReplicaID, WaitTime: cfg.Lock.WaitTime,
		Logger: log, Metrics: ownership.NewMetrics(reg)})
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return closing{l, c.Close}, nil
}

type closing struct {
	*redislock.Locker
	closeClient func() error
}

func (c closing) Close() error { err := c.Locker.Close(); _ = c.closeClient(); return err }

// completed waits for the run.completed of the request.
func (d *deployment) completed(t *testing.T, requestID string) events.Event {
	t.Helper()
	var got events.Event
	require.Eventually(t, func() bool {
		for _, e := range d.rec.OfType(events.RunCompleted) {
			if e.RequestID == requestID {
				got = e
				return true
			}
		}
		return false
	}, 60*time.Second, 20*time.Millisecond, "no run.completed for %s", requestID)
	return got
}

func (d *deployment) produce(t *testing.T, value string) *kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(d.brokers...), kgo.ProducerLinger(0))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	rec := &kgo.Record{Topic: d.names.Topic(replenish.Topic), Value: []byte(value)}
	require.NoError(t, cl.ProduceSync(ctx, rec).FirstErr())
	return rec
}

func (d *deployment) post(t *testing.T, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest("POST", d.http+"/v1/msisdn-pool/replenishments", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+d.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

func (d *deployment) numbers(t *testing.T, from, to string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, d.pg.Pool.QueryRow(context.Background(),
		`select count(*) from msisdn_pool where state = 'FREE' and msisdn between $1 and $2`, from, to).Scan(&n))
	return n
}

// A replenishment from Kafka: the record is decoded by the kind, run by the
// template, committed; a bad one is dead-lettered with the kind's reason.
func TestReplenishFromKafka(t *testing.T) {
	t.Parallel()
	d := newDeployment(t)
	d.produce(t, `{"first":"447700100000","count":500,"request_id":"kafka-1","requested_by":"ops"}`)
	done := d.completed(t, "kafka-1")
	require.Equal(t, "kafka", done.Trigger)
	require.Equal(t, "msisdn-pool:replenish", done.Key)
	require.Equal(t, "msisdn-pool", done.Job)
	require.Equal(t, int64(500), done.Extra["added"])
	require.Equal(t, int64(500), d.numbers(t, "447700100000", "447700100499"))

	bad := d.produce(t, `{"first":"447700100000","count":1,"msisdns":["447700100001"]}`)
	dlq := testenv.ReadRecords(t, d.brokers, d.names.DLQ, 1)
	require.Equal(t, bad.Value, dlq[0].Value, "original bytes")
	headers := map[string]string{}
	for _, h := range dlq[0].Headers {
		headers[h.Key] = string(h.Value)
	}
	require.Equal(t, replenish.ReasonConflictingNumbers, headers["reason"])
	require.Equal(t, d.names.Topic(replenish.Topic), headers["source-topic"])
	require.Eventually(t, func() bool { return len(d.rec.OfType(events.TriggerRejected)) == 1 }, 30*time.Second, 20*time.Millisecond)
	rejected := d.rec.OfType(events.TriggerRejected)[0]
	require.Equal(t, "msisdn-pool:replenish", rejected.Key)
	require.Equal(t, replenish.ReasonConflictingNumbers, rejected.Extra["reason"])

	// The record behind the bad one is processed.
	d.produce(t, `{"msisdns":["447700100499","447700100500"],"request_id":"kafka-2"}`)
	done = d.completed(t, "kafka-2")
	require.Equal(t, int64(1), done.Extra["added"])
	require.Equal(t, int64(1), done.Extra["existing"])
}

// A replenishment over HTTP: synchronous, 200 with the counts; bad input
// 400 naming what was wrong; 409 naming the owner while another replica
// holds the lock.
func TestReplenishOverHTTP(t *testing.T) {
	t.Parallel()
	d := newDeployment(t)
	code, body := d.post(t, `{"first":"447700200000","count":50,"request_id":"http-1"}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "completed", body["outcome"])
	require.Equal(t, "msisdn-pool:replenish", body["key"])
	require.EqualValues(t, 50, body["counts"].(map[string]any)["added"])
	require.Equal(t, "http", d.completed(t, "http-1").Trigger)
	require.Equal(t, int64(50), d.numbers(t, "447700200000", "447700200049"))

	code, body = d.post(t, `{"first":"447700200000"}`)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body["detail"], "first needs count")
	code, body = d.post(t, `{"msisdns":["447700200001"],"force":true}`)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body["detail"], "unknown field")

	other, err := openLocker(context.Background(), config.Config{ReplicaID: "replica-b", Lock: config.Lock{RedisURL: d.rd.URL, RedisMode: "single",
		KeyPrefix: d.rd.Prefix, WaitTime: time.Second}}, slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	defer other.Close()
	held, err := other.Acquire(context.Background(), replenish.Key, 0)
	require.NoError(t, err)
	code, body = d.post(t, `{"msisdns":["447700200999"]}`)
	require.Equal(t, http.StatusConflict, code, body)
	require.Equal(t, "replica-b", body["owner"])
	require.Equal(t, "already_owned", body["reason"])
	require.NoError(t, held.Release(context.Background()))
	require.Zero(t, d.numbers(t, "447700200999", "447700200999"), "nothing added while another replica owned the lock")
}

// `coordinator run replenish` (a range, a list) and `coordinator trigger
// replenish`, with the built binary against the same services.
func TestReplenishFromTheCLI(t *testing.T) {
	t.Parallel()
	d := newDeployment(t)
	bin := testenv.CoordinatorBinary(t)

	out, errs, code := d.cli(t, bin, "run", "replenish", "--first", "447700300000", "--count", "20", "--request-id", "cli-1")
	require.Equal(t, job.ExitOK, code, errs)
	var res job.Result
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, job.OutcomeCompleted, res.Outcome)
	require.Equal(t, "msisdn-pool", res.Job)
	require.Equal(t, "cli-1", res.RequestID)
	require.Equal(t, int64(20), res.Counts["added"])
	require.Contains(t, errs, `"type":"run.completed"`)

	out, errs, code = d.cli(t, bin, "run", "replenish", "447700300019", "447700300020")
	require.Equal(t, job.ExitOK, code, errs)
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, map[string]int64{"added": 1, "existing": 1, "offered": 2}, res.Counts)
	require.Equal(t, int64(21), d.numbers(t, "447700300000", "447700300020"))

	_, errs, code = d.cli(t, bin, "run", "replenish", "--first", "447700300000")
	require.Equal(t, job.ExitUsage, code)
	require.Contains(t, errs, "rejected (bad_count): first needs count")

	// trigger produces the record the replica consumes.
	out, errs, code = d.cli(t, bin, "trigger", "replenish", "--first", "447700300100", "--count", "5", "--request-id", "cli-trigger")
	require.Equal(t, job.ExitOK, code, errs)
	var p struct {
		Topic string          `json:"topic"`
		Value json.RawMessage `json:"value"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &p), out)
	require.Equal(t, d.names.Topic(replenish.Topic), p.Topic)
	require.JSONEq(t, `{"first":"447700300100","count":5,"request_id":"cli-trigger","requested_by":"cli:unknown"}`, string(p.Value))
	done := d.completed(t, "cli-trigger")
	require.Equal(t, "kafka", done.Trigger)
	require.Equal(t, int64(5), done.Extra["added"])
}

func (d *deployment) cli(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range d.env {
		if k != "COORDINATOR_REPLICA_ID" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.Env = append(cmd.Env, "COORDINATOR_REPLICA_ID=cli")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if code < 0 {
		t.Fatalf("coordinator %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}
