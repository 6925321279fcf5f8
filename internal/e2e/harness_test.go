// Package e2e runs replicas of the built coordinator binary as separate
// processes against real Kafka, Redis and PostgreSQL, and checks what they
// do from the outside: the events on the events topic, the committed
// offsets of the trigger group, the rows in Postgres and the HTTP answers.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/kinds"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/topics"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { testenv.RemoveBinaries() }))
}

// deployment is one isolated coordinator installation: its own Postgres
// schema, Redis key prefix, Kafka topic prefix and consumer group.
type deployment struct {
	t          *testing.T
	pg         *testenv.PG
	redisURL   string
	lockPrefix string
	// redis is a client on the shared test Redis (nil with a Redis of the test's own).
	redis    *redis.Client
	brokers  []string
	topicPfx string
	group    string
	names    topics.Names
	// bills is the bill-run trigger topic.
	bills string
	token string
	// env is what every replica gets (before its own extras).
	env map[string]string

	kc     *kgo.Client
	adm    *kadm.Client
	events *eventLog
}

// newDeployment sets everything up; redisURL "" means the shared test Redis.
func newDeployment(t *testing.T, redisURL string) *deployment {
	t.Helper()
	return newDeploymentOn(t, redisURL, testenv.Postgres(t))
}

// newDeploymentOn is newDeployment on the given (migrated) database.
func newDeploymentOn(t *testing.T, redisURL string, pg *testenv.PG) *deployment {
	t.Helper()
	kafka := testenv.Kafka(t)
	d := &deployment{
		t:        t,
		pg:       pg,
		brokers:  kafka.Brokers,
		topicPfx: kafka.Suffix,
		group:    "g_" + kafka.Suffix,
		token:    testenv.AdminToken(),
	}
	reg, err := kinds.Config{}.Registry()
	require.NoError(t, err)
	d.names = topics.New(kafka.Suffix, reg.Topics()...)
	d.bills = d.names.Topic(billrun.Topic)
	if redisURL == "" {
		r := testenv.Redis(t)
		d.redisURL, d.lockPrefix, d.redis = r.URL, r.Prefix, r.Client
	} else {
		d.redisURL, d.lockPrefix = redisURL, testenv.UniqueName("t")
	}
	d.env = map[string]string{
		"COORDINATOR_DATABASE_URL":          pg.DSN,
		"COORDINATOR_LOCK_REDIS_URL":        d.redisURL,
		"COORDINATOR_LOCK_KEY_PREFIX":       d.lockPrefix,
		"COORDINATOR_LOCK_WAIT_TIME":        "1s",
		"COORDINATOR_LOCK_WATCHDOG_TIMEOUT": "10s",
		"COORDINATOR_KAFKA_BROKERS":         strings.Join(d.brokers, ","),
		"COORDINATOR_KAFKA_TOPIC_PREFIX":    d.topicPfx,
		"COORDINATOR_KAFKA_GROUP":           d.group,
		"COORDINATOR_KAFKA_CREATE_TOPICS":   "true",
		"COORDINATOR_HTTP_ADDR":             "127.0.0.1:0",
		"COORDINATOR_ADMIN_TOKEN":           d.token,
		"COORDINATOR_LOG_FORMAT":            "json",
		"COORDINATOR_SHUTDOWN_TIMEOUT":      "10s",
		"COORDINATOR_BILLRUN_BATCH_SIZE":    "100",
		// A killed replica's partitions move after 15 s instead of 45 s
		// (above the watchdog timeout plus the wait time, as serve requires).
		"COORDINATOR_KAFKA_SESSION_TIMEOUT": "15s",
		// Runs that did not complete are looked for every second.
		"COORDINATOR_RESUME_INTERVAL": "1s",
	}

	d.kc, err = kgo.NewClient(kgo.SeedBrokers(d.brokers...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	require.NoError(t, err)
	t.Cleanup(d.kc.Close)
	d.adm = kadm.NewClient(d.kc)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, topics.Ensure(ctx, d.adm, d.names, true))
	// Runs after the replicas and the event tail stopped (cleanups are LIFO).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if _, err := d.adm.DeleteGroups(ctx, d.group, d.group+"-console"); err != nil {
			t.Logf("delete group %s: %v", d.group, err)
		}
		if _, err := d.adm.DeleteTopics(ctx, d.names.All()...); err != nil {
			t.Logf("delete topics: %v", err)
		}
	})
	d.events = newEventLog(t, d.brokers, d.names.Events)
	return d
}

// replica is one `coordinator serve` process.
type replica struct {
	id   string
	cmd  *exec.Cmd
	addr string
	done chan struct{}

	mu    sync.Mutex
	lines []string
}

// start runs a replica and waits for its start line (which names the HTTP
// address it bound). The process is killed at cleanup if still running.
func (d *deployment) start(id string, extra map[string]string, args ...string) *replica {
	t := d.t
	t.Helper()
	env := []string{}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "COORDINATOR_") || k == "DATABASE_URL" || k == "REDIS_URL" {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range d.env {
		env = append(env, k+"="+v)
	}
	env = append(env, "COORDINATOR_REPLICA_ID="+id)
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	cmd := exec.Command(testenv.CoordinatorBinary(t), append([]string{"serve"}, args...)...)
	cmd.Env = env
	// A replica dies with the test binary, even one killed by a timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	cmd.Stdout = io.Discard
	require.NoError(t, cmd.Start())

	r := &replica{id: id, cmd: cmd, done: make(chan struct{})}
	started := make(chan string, 1)
	go func() {
		defer close(r.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			r.mu.Lock()
			r.lines = append(r.lines, line)
			r.mu.Unlock()
			var l struct {
				Msg  string `json:"msg"`
				Addr string `json:"http_addr"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "coordinator_started" {
				started <- l.Addr
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		r.kill()
		for _, l := range r.logLines() {
			if strings.Contains(l, "WARNING: DATA RACE") {
				t.Errorf("replica %s: the race detector found a data race (its log follows)", id)
				break
			}
		}
		if t.Failed() {
			r.mu.Lock()
			lines := r.lines
			if len(lines) > 80 {
				lines = lines[len(lines)-80:]
			}
			t.Logf("replica %s, last log lines:\n%s", id, strings.Join(lines, "\n"))
			r.mu.Unlock()
		}
	})
	select {
	case r.addr = <-started:
	case <-r.done:
		t.Fatalf("replica %s exited before starting (%v):\n%s", id, cmd.ProcessState, strings.Join(r.logLines(), "\n"))
	case <-time.After(30 * time.Second):
		t.Fatalf("replica %s did not start within 30s:\n%s", id, strings.Join(r.logLines(), "\n"))
	}
	return r
}

func (r *replica) logLines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

// kill sends SIGKILL (by PID) and waits for the process to be reaped.
func (r *replica) kill() {
	select {
	case <-r.done:
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
}

// terminate sends SIGTERM and waits up to bound for a clean exit.
func (r *replica) terminate(t *testing.T, bound time.Duration) int {
	t.Helper()
	require.NoError(t, r.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-r.done:
		return r.cmd.ProcessState.ExitCode()
	case <-time.After(bound):
		t.Fatalf("replica %s did not stop within %s after SIGTERM", r.id, bound)
		return -1
	}
}

// post sends an authenticated JSON POST to the replica's admin API.
func (r *replica) post(t *testing.T, token, path, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest("POST", "http://"+r.addr+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	return do(t, req)
}

func (r *replica) get(t *testing.T, token, path string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+r.addr+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	code, _, body := do(t, req)
	return code, body
}

func do(t *testing.T, req *http.Request) (int, http.Header, []byte) {
	t.Helper()
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, body
}

// startReplicas starts n replicas r1..rn and waits until the consumer group
// is stable with all of them, so no later join moves a partition mid-test.
func (d *deployment) startReplicas(n int, extra map[string]string, args ...string) []*replica {
	d.t.Helper()
	rs := make([]*replica, n)
	for i := range rs {
		rs[i] = d.start(fmt.Sprintf("r%d", i+1), extra, args...)
	}
	d.waitGroupStable(n)
	return rs
}

func (d *deployment) waitGroupStable(members int) {
	t := d.t
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		gs, err := d.adm.DescribeGroups(ctx, d.group)
		require.NoError(c, err)
		g, ok := gs[d.group]
		require.True(c, ok, "group %s not described", d.group)
		require.NoError(c, g.Err)
		require.Equal(c, "Stable", g.State, "consumer group state")
		require.Len(c, g.Members, members, "consumer group members")
	}, 40*time.Second, 50*time.Millisecond)
}

// produce writes one record and returns its partition and offset.
func (d *deployment) produce(topic, key, value string) (int32, int64) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	rec := &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value)}
	require.NoError(d.t, d.kc.ProduceSync(ctx, rec).FirstErr())
	return rec.Partition, rec.Offset
}

// committed returns the group's committed offset on topic/partition (-1: none).
func (d *deployment) committed(topic string, partition int32) int64 {
	d.t.Helper()
	at, err := d.committedOffset(topic, partition)
	require.NoError(d.t, err)
	return at
}

func (d *deployment) committedOffset(topic string, partition int32) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := d.adm.FetchOffsets(ctx, d.group)
	if err != nil {
		return 0, err
	}
	o, ok := offs.Lookup(topic, partition)
	if !ok || o.Err != nil {
		return -1, nil
	}
	return o.At, nil
}

// waitCommitted waits until the group's committed offset on topic/partition
// is want (Kafka offers nothing to wait on but asking again).
func (d *deployment) waitCommitted(topic string, partition int32, want int64, within time.Duration) {
	d.t.Helper()
	require.EventuallyWithT(d.t, func(c *assert.CollectT) {
		at, err := d.committedOffset(topic, partition)
		require.NoError(c, err)
		require.Equal(c, want, at, "committed offset of %s/%d", topic, partition)
	}, within, 50*time.Millisecond)
}

// billRunTrigger is a billing.billrun.requested value.
func billRunTrigger(period, requestID string) string {
	b, _ := json.Marshal(map[string]string{"period": period, "request_id": requestID, "requested_by": "e2e"})
	return string(b)
}

// seedSubscribers creates n subscribers: every tenth SUSPENDED, every
// fifteenth TERMINATED, the rest ACTIVE with a fee of 1000 + id%7 cents, and
// a usage charge of 50 cents for every third one in period.
func (d *deployment) seedSubscribers(n int, period string) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := d.pg.Pool.Exec(ctx, `
insert into subscribers (id, msisdn, status, monthly_fee_cents)
select g, '4470' || g,
       case when g % 10 = 0 then 'SUSPENDED' when g % 15 = 0 then 'TERMINATED' else 'ACTIVE' end,
       1000 + g % 7
from generate_series(1, $1::bigint) g`, n)
	require.NoError(d.t, err)
	_, err = d.pg.Pool.Exec(ctx, `
insert into usage_charges (subscriber_id, period, amount_cents)
select g, $2, 50 from generate_series(3, $1::bigint, 3) g`, n, period)
	require.NoError(d.t, err)
}

// requireInvoicesExact checks that every ACTIVE subscriber has exactly one
// invoice for period with fee + usage, and nobody else has one.
func (d *deployment) requireInvoicesExact(period string) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var active, invoices, wrong int64
	require.NoError(d.t, d.pg.Pool.QueryRow(ctx, `select count(*) from subscribers where status = 'ACTIVE'`).Scan(&active))
	require.NoError(d.t, d.pg.Pool.QueryRow(ctx, `select count(*) from invoices where period = $1`, period).Scan(&invoices))
	require.NoError(d.t, d.pg.Pool.QueryRow(ctx, `
select count(*) from subscribers s
full join (select * from invoices where period = $1) i on i.subscriber_id = s.id
where (s.status = 'ACTIVE') is distinct from (i.id is not null)
   or i.amount_cents <> s.monthly_fee_cents + coalesce((select sum(amount_cents) from usage_charges u where u.subscriber_id = s.id and u.period = $1), 0)`,
		period).Scan(&wrong))
	require.Positive(d.t, active)
	require.Equal(d.t, active, invoices, "one invoice per ACTIVE subscriber")
	require.Zero(d.t, wrong, "subscribers with a missing, extra or wrong invoice")
}

// event is a CloudEvent read back from the events topic.
type event struct {
	Type    string         `json:"type"`
	Subject string         `json:"subject"`
	Time    time.Time      `json:"time"`
	Data    map[string]any `json:"data"`
}

func (e event) str(k string) string {
	s, _ := e.Data[k].(string)
	return s
}

func (e event) num(k string) int64 {
	f, _ := e.Data[k].(float64)
	return int64(f)
}

func (e event) String() string {
	return fmt.Sprintf("%s %s %s replica=%s owner=%s request_id=%s trigger=%s",
		e.Time.Format("15:04:05.000"), e.Type, e.Subject, e.str("replica"), e.str("owner"), e.str("request_id"), e.str("trigger"))
}

// eventLog tails the events topic from the start (no group).
type eventLog struct {
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	events []event
	bad    [][]byte
}

func newEventLog(t *testing.T, brokers []string, topic string) *eventLog {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	l := &eventLog{cl: cl, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			fs.EachRecord(func(r *kgo.Record) {
				var e event
				l.mu.Lock()
				defer l.mu.Unlock()
				if json.Unmarshal(r.Value, &e) != nil || e.Subject != string(r.Key) {
					l.bad = append(l.bad, r.Value)
					return
				}
				l.events = append(l.events, e)
			})
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-l.done
		cl.Close()
		l.mu.Lock()
		defer l.mu.Unlock()
		if t.Failed() {
			var b bytes.Buffer
			for _, e := range l.events {
				fmt.Fprintln(&b, e)
			}
			t.Logf("events seen:\n%s", b.String())
		}
		require.Empty(t, l.bad, "every record on the events topic is a CloudEvent keyed by its subject")
	})
	return l
}

// match returns the events for which keep is true, in arrival order.
func (l *eventLog) match(keep func(event) bool) []event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []event
	for _, e := range l.events {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// waitFor waits until at least n events match keep and returns them.
func (l *eventLog) waitFor(t *testing.T, bound time.Duration, n int, what string, keep func(event) bool) []event {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.GreaterOrEqual(c, len(l.match(keep)), n, "%s events", what)
	}, bound, 50*time.Millisecond)
	return l.match(keep)
}

func ofType(typ, subject string) func(event) bool {
	return func(e event) bool { return e.Type == typ && e.Subject == subject }
}

// monthsAgo is the period n months before the current one (UTC, the
// default billing zone): closed for n >= 1. Tests use distinct periods so
// they can share a database.
func monthsAgo(n int) string {
	p := billrun.PeriodOf(time.Now().UTC())
	for range n {
		p = p.Previous()
	}
	return p.String()
}
