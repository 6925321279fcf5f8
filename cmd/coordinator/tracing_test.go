package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/telemetry/otlptest"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// serveProc is `coordinator serve` run as a process of its own, with the
// environment given (the OTEL_* variables are the SDK's: process
// environment only).
type serveProc struct {
	cmd      *exec.Cmd
	mu       sync.Mutex
	out      strings.Builder
	started  chan string // the http_addr of coordinator_started
	exited   chan struct{}
	exitCode int
}

func startServe(t *testing.T, env map[string]string) *serveProc {
	t.Helper()
	cmd := exec.Command(coordinatorBinary(t), "serve")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "PATH="+os.Getenv("PATH"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	cmd.Stdout = io.Discard
	require.NoError(t, cmd.Start())
	p := &serveProc{cmd: cmd, started: make(chan string, 1), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.out.WriteString(line + "\n")
			p.mu.Unlock()
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "coordinator_started" {
				p.started <- fmt.Sprint(m["http_addr"])
			}
		}
		_ = cmd.Wait()
		p.exitCode = cmd.ProcessState.ExitCode()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
	})
	select {
	case addr := <-p.started:
		p.started <- addr
	case <-p.exited:
		t.Fatalf("serve exited at start: %s", p.output())
	case <-time.After(60 * time.Second):
		t.Fatalf("serve not started within 60s: %s", p.output())
	}
	return p
}

func (p *serveProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *serveProc) addr() string {
	a := <-p.started
	p.started <- a
	return a
}

// stop sends SIGTERM and waits: serve flushes its spans as it exits.
func (p *serveProc) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("serve did not stop: %s", p.output())
	}
	require.Equal(t, 0, p.exitCode, p.output())
}

// readEvents reads the events topic until n events for key arrived.
func readEvents(t *testing.T, brokers []string, topic, key string, n int) []events.CloudEvent {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []events.CloudEvent
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "got %d of %d events for %s", len(out), n, key)
		fs.EachRecord(func(r *kgo.Record) {
			var ce events.CloudEvent
			if json.Unmarshal(r.Value, &ce) == nil && ce.Subject == key {
				out = append(out, ce)
			}
		})
	}
	return out
}

var traceParentRE = regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-0[01]$`)

// One bill run triggered from Kafka with a traceparent header, exported to
// an in-process OTLP receiver over HTTP and over gRPC: the whole span tree
// in the trigger's trace (receipt, run, lock acquire with its Redis
// commands, claim and every batch with their SQL, every event with its
// Kafka publish), and every CloudEvent of the run carrying the run span's
// traceparent. Over HTTP, a POST with a traceparent header too.
func TestServeTracesABillRunEndToEnd(t *testing.T) {
	for _, proto := range []string{"http/protobuf", "grpc"} {
		t.Run(proto, func(t *testing.T) {
			t.Parallel()
			rcv := otlptest.Start(t)
			endpoint := rcv.HTTPEndpoint()
			if proto == "grpc" {
				endpoint = rcv.GRPCEndpoint()
			}
			kenv, names := kafkaCLI(t)
			pg, rd := testenv.Postgres(t), testenv.Redis(t)
			env := map[string]string{"COORDINATOR_DATABASE_URL": pg.DSN, "COORDINATOR_LOCK_REDIS_URL": rd.URL,
				"COORDINATOR_LOCK_KEY_PREFIX": rd.Prefix, "COORDINATOR_BILLRUN_BATCH_SIZE": "40", "COORDINATOR_REPLICA_ID": "traced",
				"COORDINATOR_HTTP_ADDR": "127.0.0.1:0", "COORDINATOR_REAPER_SCHEDULE": "", "COORDINATOR_SHUTDOWN_TIMEOUT": "10s",
				"COORDINATOR_KAFKA_GROUP": names.Events + ".group", "COORDINATOR_LOG_FORMAT": "json",
				"COORDINATOR_ADMIN_TOKEN": testenv.AdminToken(), "COORDINATOR_KAFKA_SESSION_TIMEOUT": "6s",
				"COORDINATOR_LOCK_WATCHDOG_TIMEOUT": "3s", "COORDINATOR_LOCK_WAIT_TIME": "1s",
				"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": proto, "OTEL_EXPORTER_OTLP_INSECURE": "true",
				"OTEL_BSP_SCHEDULE_DELAY": "200"}
			for k, v := range kenv {
				env[k] = v
			}
			code, _, errs := runCLI(t, env, "seed", "--subscribers", "200")
			require.Equal(t, 0, code, errs)
			brokers := strings.Split(env["COORDINATOR_KAFKA_BROKERS"], ",")
			srv := startServe(t, env)

			const parentTrace, parentSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
			prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
			require.NoError(t, err)
			defer prod.Close()
			pctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.NoError(t, prod.ProduceSync(pctx, &kgo.Record{Topic: names.Topic(billrun.Topic), Key: []byte("2026-10"),
				Value:   []byte(`{"period":"2026-10","request_id":"traced-kafka"}`),
				Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-" + parentTrace + "-" + parentSpan + "-01")}}}).FirstErr())

			evs := readEvents(t, brokers, names.Events, "billrun:2026-10", 3) // acquired, completed, released
			var completed events.CloudEvent
			tps := map[string]bool{}
			for _, ce := range evs {
				tps[ce.TraceParent] = true
				if ce.Type == events.RunCompleted {
					completed = ce
				}
			}
			require.Len(t, tps, 1, "every event of the run carries one traceparent: %v", tps)
			m := traceParentRE.FindStringSubmatch(completed.TraceParent)
			require.NotNil(t, m, "traceparent %q", completed.TraceParent)
			require.Equal(t, parentTrace, m[1], "the run is in the trigger's trace")
			runSpanID := m[2]

			var httpTrace string
			if proto == "http/protobuf" {
				httpTrace = "0af7651916cd43dd8448eb211c80319c"
				req, err := http.NewRequest(http.MethodPost, "http://"+srv.addr()+"/v1/billruns", strings.NewReader(`{"period":"2026-09"}`))
				require.NoError(t, err)
				req.Header.Set("Authorization", "Bearer "+env["COORDINATOR_ADMIN_TOKEN"])
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("traceparent", "00-"+httpTrace+"-b7ad6b7169203331-01")
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				_ = resp.Body.Close()
				require.Equal(t, http.StatusAccepted, resp.StatusCode)
				for _, ce := range readEvents(t, brokers, names.Events, "billrun:2026-09", 3) {
					require.Contains(t, ce.TraceParent, "00-"+httpTrace+"-", "%s", ce.Type)
				}
			}
			srv.stop(t)

			spans := rcv.Spans()
			var tree []otlptest.Span
			for _, s := range spans {
				if s.TraceID == parentTrace {
					tree = append(tree, s)
				}
			}
			byID := otlptest.ByID(tree)
			children := map[string][]otlptest.Span{}
			for _, s := range tree {
				children[s.ParentID] = append(children[s.ParentID], s)
			}
			one := func(parent, name string) otlptest.Span {
				t.Helper()
				var got []otlptest.Span
				for _, s := range children[parent] {
					if s.Name == name {
						got = append(got, s)
					}
				}
				require.Lenf(t, got, 1, "one %q under %s (%s)", name, parent, byID[parent].Name)
				return got[0]
			}
			topic := names.Topic(billrun.Topic)
			receive := one(parentSpan, topic+" receive")
			process := one(receive.SpanID, topic+" process")
			run := one(process.SpanID, "run billrun")
			require.Equal(t, runSpanID, run.SpanID, "the events' traceparent names the run's span")
			require.Equal(t, "completed", run.Attrs["coordinator.outcome"])
			require.Equal(t, "traced-kafka", run.Attrs["coordinator.request_id"])
			require.Equal(t, "coordinator", run.Service)
			require.Equal(t, "traced", run.Resource["service.instance.id"])

			acquire := one(run.SpanID, "lock.acquire")
			require.NotEmpty(t, children[acquire.SpanID], "the lock's Redis commands (redisotel)")
			for _, c := range children[acquire.SpanID] {
				require.Contains(t, c.Scope, "redisotel")
			}
			claim := one(run.SpanID, "run.claim")
			require.NotEmpty(t, children[claim.SpanID], "the claim's SQL (otelpgx)")
			one(run.SpanID, "lock.release")

			var batches int
			for _, s := range children[run.SpanID] {
				if s.Name != "billrun.batch" {
					continue
				}
				batches++
				require.NotEmptyf(t, children[s.SpanID], "batch %v has its SQL beneath", s.Attrs["billrun.first_id"])
				for _, q := range children[s.SpanID] {
					require.Contains(t, q.Scope, "otelpgx")
				}
			}
			require.Equal(t, completed.Data["batches_committed"], float64(batches), "a span per batch")
			require.Equal(t, 5, batches, "200 ACTIVE subscribers in batches of 40")

			for _, typ := range []string{"ownership.acquired", "run.completed", "ownership.released"} {
				ev := one(run.SpanID, "event "+typ)
				pub := one(ev.SpanID, names.Events+" publish")
				require.Equal(t, "billrun:2026-10", pub.Attrs["messaging.kafka.message.key"])
			}

			if httpTrace != "" {
				var server otlptest.Span
				for _, s := range spans {
					if s.TraceID == httpTrace && s.ParentID == "b7ad6b7169203331" {
						server = s
					}
				}
				require.Equal(t, "POST /v1/billruns", server.Name)
				found := false
				for _, s := range spans {
					found = found || (s.Name == "run billrun" && s.ParentID == server.SpanID)
				}
				require.True(t, found, "the HTTP-triggered run is the request span's child")
			}
		})
	}
}
