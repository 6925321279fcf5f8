package eventsink_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/eventsink"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/topics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// eventsTopic creates a fresh events topic on the test broker.
func eventsTopic(t *testing.T) (brokers []string, topic string) {
	t.Helper()
	k := testenv.Kafka(t)
	names := topics.New(k.Suffix)
	adm, err := topics.Dial(k.Brokers)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = adm.CreateTopics(ctx, 3, -1, nil, names.Events)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, names.Events)
		adm.Close()
	})
	return k.Brokers, names.Events
}

func TestRoundTripCloudEventsKeyedByLockKey(t *testing.T) {
	t.Parallel()
	brokers, topic := eventsTopic(t)
	reg := prometheus.NewRegistry()
	sink, err := eventsink.New(eventsink.Config{Brokers: brokers, Topic: topic, Metrics: eventsink.NewMetrics(reg)})
	require.NoError(t, err)
	require.NoError(t, sink.Start(context.Background()))
	defer sink.Stop()

	const n = 50
	for i := range n {
		sink.Emit(context.Background(), events.Event{
			Type: events.OwnershipAcquired, Key: fmt.Sprintf("billrun:2026-%02d", i%12+1), Job: "billrun",
			Replica: "r1", Trigger: "kafka", RequestID: fmt.Sprintf("req-%d", i), Fence: int64(i + 1),
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, sink.Flush(ctx))
	require.Zero(t, sink.Buffered())
	require.Equal(t, float64(n), metricValue(t, reg, "coordinator_events_published_total"))

	recs := testenv.ReadRecords(t, brokers, topic, n)
	require.Len(t, recs, n)
	seen := map[string]bool{}
	for _, r := range recs {
		require.Equal(t, []kgo.RecordHeader{{Key: "content-type", Value: []byte(eventsink.ContentType)}}, r.Headers)
		var ce events.CloudEvent
		require.NoError(t, json.Unmarshal(r.Value, &ce))
		require.Equal(t, "1.0", ce.SpecVersion)
		require.Equal(t, events.OwnershipAcquired, ce.Type)
		require.Equal(t, events.Source, ce.Source)
		require.Equal(t, string(r.Key), ce.Subject)
		require.Equal(t, string(r.Key), ce.Data["key"])
		require.NotEmpty(t, ce.ID)
		require.False(t, ce.Time.IsZero())
		seen[ce.Data["request_id"].(string)] = true
	}
	require.Len(t, seen, n, "every event exactly once")
}

// metricValue reads one unlabelled counter or gauge from reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// freePort returns a loopback address nothing listens on (yet).
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func TestKafkaDownBuffersBoundedDropsOldestThenDelivers(t *testing.T) {
	t.Parallel()
	brokers, topic := eventsTopic(t)
	seed := freePort(t) // Kafka "down": nothing listens on the only seed broker
	reg := prometheus.NewRegistry()
	sink, err := eventsink.New(eventsink.Config{Brokers: []string{seed}, Topic: topic, BufferSize: 8, Metrics: eventsink.NewMetrics(reg)})
	require.NoError(t, err)
	require.NoError(t, sink.Start(context.Background()))
	defer sink.Stop()

	const n = 20
	for i := range n { // returns although nothing can be published
		sink.Emit(context.Background(), events.Event{Type: events.RunCompleted, Key: "msisdn-reaper:sweep", Job: "msisdn-reaper",
			Replica: "r1", Trigger: "cron", RequestID: fmt.Sprintf("req-%02d", i)})
	}
	require.Equal(t, 8, sink.Buffered(), "the buffer is bounded")
	require.EqualValues(t, n-8, sink.Dropped())
	require.Equal(t, float64(n-8), metricValue(t, reg, "coordinator_events_dropped_total"))
	require.Equal(t, float64(8), metricValue(t, reg, "coordinator_events_buffered"))

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	require.Error(t, sink.Flush(ctx), "nothing can be flushed while Kafka is down")
	cancel()

	// Kafka comes back: the seed address now leads to the broker.
	stop := proxy(t, seed, brokers[0])
	defer stop()
	ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, sink.Flush(ctx))

	recs := testenv.ReadRecords(t, brokers, topic, 8)
	got := map[string]bool{}
	for _, r := range recs {
		var ce events.CloudEvent
		require.NoError(t, json.Unmarshal(r.Value, &ce))
		got[ce.Data["request_id"].(string)] = true
	}
	// The newest seven survived; the oldest waiting ones were dropped (the
	// one already in the client's hands stays: one key, so one in flight).
	for i := n - 7; i < n; i++ {
		require.True(t, got[fmt.Sprintf("req-%02d", i)], "req-%02d delivered", i)
	}
	require.Len(t, got, 8)
	require.Equal(t, float64(8), metricValue(t, reg, "coordinator_events_published_total"))
}

func TestStopIsSafeTwiceAndDropsAfterwards(t *testing.T) {
	t.Parallel()
	sink, err := eventsink.New(eventsink.Config{Brokers: []string{freePort(t)}, Topic: "x", BufferSize: 4, StopTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, sink.Start(context.Background()))
	sink.Emit(context.Background(), events.Event{Type: events.RunCompleted, Key: "k"})
	sink.Stop()
	sink.Stop()
	require.EqualValues(t, 1, sink.Dropped(), "what could not be flushed within the bound is counted")
	sink.Emit(context.Background(), events.Event{Type: events.RunCompleted, Key: "k"})
	require.EqualValues(t, 2, sink.Dropped())
	require.Zero(t, sink.Buffered())
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	_, err := eventsink.New(eventsink.Config{Topic: "x"})
	require.ErrorContains(t, err, "Brokers")
	_, err = eventsink.New(eventsink.Config{Brokers: []string{"127.0.0.1:1"}})
	require.ErrorContains(t, err, "Topic")
}

// proxy forwards TCP connections from listen to target until stopped.
func proxy(t *testing.T, listen, target string) (stop func()) {
	t.Helper()
	l, err := net.Listen("tcp", listen)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(u, c); _ = u.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(c, u); _ = c.Close() }()
		}
	}()
	return func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
}

// A record the client gives up on is retried; later records of the same key
// must not overtake it (docs/events.md promises per-key order). The fault:
// the first try of r0 is held, and failed only once the sink has handed a
// record of another key to the client, that is, once it went past key K.
func TestFailedRecordIsNotOvertakenByLaterRecordsOfItsKey(t *testing.T) {
	t.Parallel()
	brokers, topic := eventsTopic(t)
	sink, err := eventsink.New(eventsink.Config{Brokers: brokers, Topic: topic})
	require.NoError(t, err)
	injected := errors.New("injected: the client gave up on the record")
	var (
		mu     sync.Mutex
		held   *kgo.Record
		hold   func(*kgo.Record, error)
		failed = make(chan struct{})
		once   sync.Once
	)
	requestID := func(r *kgo.Record) string { // called on the sink's goroutine: no require here
		var ce events.CloudEvent
		if json.Unmarshal(r.Value, &ce) != nil {
			return ""
		}
		id, _ := ce.Data["request_id"].(string)
		return id
	}
	eventsink.WrapProduce(sink, func(next eventsink.ProduceFunc) eventsink.ProduceFunc {
		return func(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
			id := requestID(r)
			mu.Lock()
			if id == "k-0" && held == nil {
				held, hold = r, promise // the first try of k-0 never reaches Kafka
				mu.Unlock()
				return
			}
			mu.Unlock()
			next(ctx, r, promise)
			if string(r.Key) == "other" {
				once.Do(func() {
					mu.Lock()
					r0, p := held, hold
					mu.Unlock()
					go func() { p(r0, injected); close(failed) }()
				})
			}
		}
	})
	require.NoError(t, sink.Start(context.Background()))
	defer sink.Stop()

	const n = 5
	for i := range n {
		sink.Emit(context.Background(), events.Event{Type: events.RunCompleted, Key: "K", RequestID: fmt.Sprintf("k-%d", i)})
	}
	sink.Emit(context.Background(), events.Event{Type: events.RunCompleted, Key: "other", RequestID: "other-0"})
	select {
	case <-failed:
	case <-time.After(30 * time.Second):
		t.Fatal("the sink never handed the other key's record to the client")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, sink.Flush(ctx))

	var got []string
	for _, r := range testenv.ReadRecords(t, brokers, topic, n+1) {
		if string(r.Key) == "K" {
			got = append(got, requestID(r))
		}
	}
	require.Equal(t, []string{"k-0", "k-1", "k-2", "k-3", "k-4"}, got, "per-key order kept across the retry")
}

// EmitAcked calls back once per event Kafka acknowledged, and never for an
// event dropped from the full buffer while Kafka was down.
func TestEmitAckedCallsBackOnlyForAcknowledgedEvents(t *testing.T) {
	t.Parallel()
	brokers, topic := eventsTopic(t)
	seed := freePort(t) // Kafka down
	sink, err := eventsink.New(eventsink.Config{Brokers: []string{seed}, Topic: topic, BufferSize: 8})
	require.NoError(t, err)
	require.NoError(t, sink.Start(context.Background()))
	defer sink.Stop()

	const n = 20
	acked := make(chan string, 2*n)
	for i := range n {
		id := fmt.Sprintf("ev-%02d", i)
		sink.EmitAcked(context.Background(), events.Event{ID: id, Type: events.RunCompleted, Key: "billrun:2026-11", Job: "billrun"},
			func() { acked <- id })
	}
	require.EqualValues(t, n-8, sink.Dropped())
	require.Empty(t, acked, "nothing is acknowledged while Kafka is down")

	stop := proxy(t, seed, brokers[0])
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, sink.Flush(ctx))
	got := map[string]bool{}
	for len(got) < 8 {
		select {
		case id := <-acked:
			require.False(t, got[id], "%s acknowledged twice", id)
			got[id] = true
		case <-ctx.Done():
			t.Fatalf("only %d of 8 delivered events acknowledged: %v", len(got), got)
		}
	}
	recs := testenv.ReadRecords(t, brokers, topic, 8)
	for _, r := range recs {
		var ce events.CloudEvent
		require.NoError(t, json.Unmarshal(r.Value, &ce))
		require.True(t, got[ce.ID], "delivered %s was acknowledged", ce.ID)
	}
	sink.Stop()
	require.Empty(t, acked, "a dropped event is never acknowledged")
}
