package trigger_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/topics"
	"github.com/telco-platform/coordinator/internal/trigger"
)

// call is one Handler invocation the fake saw.
type call struct {
	job    string
	period string // a bill run's
	n      int    // a widget's
	t      job.Trigger
}

// fakeHandler is a fake of the consumer's own Handler port (not of Kafka):
// it records calls and answers with outcome(callIndex).
type fakeHandler struct {
	mu      sync.Mutex
	calls   []call
	outcome func(n int, c call) job.Outcome
	block   chan struct{} // when set, BillRun waits on it or on ctx
	entered chan struct{} // BillRun sends here before blocking
	ctxErrs []error
	changed chan struct{}
	// failedOnInput: a failed outcome is one on the caller's input
	// (job.Result.BadInput).
	failedOnInput bool
}

func newFake(outcome func(n int, c call) job.Outcome) *fakeHandler {
	if outcome == nil {
		outcome = func(int, call) job.Outcome { return job.OutcomeCompleted }
	}
	return &fakeHandler{outcome: outcome, changed: make(chan struct{}, 1000)}
}

func (f *fakeHandler) record(c call) job.Outcome {
	f.mu.Lock()
	n := len(f.calls)
	f.calls = append(f.calls, c)
	f.mu.Unlock()
	f.changed <- struct{}{}
	return f.outcome(n, c)
}

func (f *fakeHandler) Run(ctx context.Context, k owned.Kind, p owned.Params, t job.Trigger) (job.Result, error) {
	c := call{job: k.Spec().Name, t: t}
	// The lock key names the run: billrun:PERIOD, widget:N.
	_, id, _ := strings.Cut(k.LockKey(p), ":")
	if c.job == billrun.JobName {
		c.period = id
	} else {
		c.n, _ = strconv.Atoi(id)
	}
	if f.block != nil {
		f.entered <- struct{}{}
		select {
		case <-f.block:
		case <-ctx.Done():
			f.mu.Lock()
			f.ctxErrs = append(f.ctxErrs, ctx.Err())
			f.mu.Unlock()
			f.record(c)
			return job.Result{Outcome: job.OutcomeLost}, nil
		}
	}
	res := job.Result{Job: c.job, Outcome: f.record(c)}
	if res.Outcome == job.OutcomeFailed && f.failedOnInput {
		res.BadInput, res.Error = true, "bad input: period "+c.period+" has no bill run: run it first"
	}
	return res, nil
}

func (f *fakeHandler) Calls() []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]call(nil), f.calls...)
}

// waitCalls waits until the fake saw at least n calls.
func (f *fakeHandler) waitCalls(t *testing.T, n int) []call {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		if c := f.Calls(); len(c) >= n {
			return c
		}
		select {
		case <-f.changed:
		case <-deadline:
			t.Fatalf("handler saw %d calls, want %d: %+v", len(f.Calls()), n, f.Calls())
		}
	}
}

type kafkaBundle struct {
	brokers []string
	names   topics.Names
	kinds   *owned.Registry
	// bills and widgets are the two trigger topics.
	bills, widgets string
	group          string
	adm            *kadm.Client
	prod           *kgo.Client
	rec            *events.Recorder
}

func setupKafka(t *testing.T) *kafkaBundle {
	t.Helper()
	k := testenv.Kafka(t)
	b := &kafkaBundle{brokers: k.Brokers, group: "g-" + k.Suffix, rec: &events.Recorder{}, kinds: registry(t, &ownedtest.Widget{})}
	b.names = topics.New(k.Suffix, b.kinds.Topics()...)
	b.bills, b.widgets = b.names.Topic(billrun.Topic), b.names.Topic(widgetTopic)
	var err error
	b.adm, err = topics.Dial(k.Brokers)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, topics.Ensure(ctx, b.adm, b.names, true))
	b.prod, err = kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ProducerLinger(0))
	require.NoError(t, err)
	t.Cleanup(func() {
		b.prod.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = b.adm.DeleteGroup(ctx, b.group)
		_, _ = b.adm.DeleteTopics(ctx, b.names.All()...)
		b.adm.Close()
	})
	return b
}

func (b *kafkaBundle) consumer(t *testing.T, h trigger.Handler, mod func(*trigger.KafkaConfig)) *trigger.KafkaConsumer {
	t.Helper()
	cfg := trigger.KafkaConfig{Brokers: b.brokers, Group: b.group, Kinds: b.kinds, Topics: b.names, Replica: "r1",
		RetryBackoffMin: 20 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond, FetchMaxWait: 100 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	c, err := trigger.NewKafkaConsumer(cfg, h, b.rec, nil, trigger.NewMetrics(nil))
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(c.Stop)
	return c
}

func (b *kafkaBundle) produce(t *testing.T, topic, key, value string, headers ...kgo.RecordHeader) *kgo.Record {
	t.Helper()
	r := &kgo.Record{Topic: topic, Value: []byte(value), Headers: headers}
	if key != "" {
		r.Key = []byte(key)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, b.prod.ProduceSync(ctx, r).FirstErr())
	return r
}

// committed returns the group's committed offset for r's partition (-1: none).
func (b *kafkaBundle) committed(t *testing.T, r *kgo.Record) int64 {
	t.Helper()
	at, err := b.committedOffset(r)
	require.NoError(t, err)
	return at
}

func (b *kafkaBundle) committedOffset(r *kgo.Record) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	os, err := b.adm.FetchOffsets(ctx, b.group)
	if err != nil {
		return 0, err
	}
	o, ok := os.Lookup(r.Topic, r.Partition)
	if !ok || o.Err != nil {
		return -1, nil
	}
	return o.At, nil
}

// waitCommitted waits until the committed offset of r's partition is want
// (Kafka's committed offsets offer nothing to wait on but asking again).
func (b *kafkaBundle) waitCommitted(t *testing.T, r *kgo.Record, want int64) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		at, err := b.committedOffset(r)
		require.NoError(c, err)
		require.Equal(c, want, at, "committed offset of %s/%d", r.Topic, r.Partition)
	}, 30*time.Second, 50*time.Millisecond)
}

// waitEvents waits until rec holds at least n events of type typ.
func waitEvents(t *testing.T, rec *events.Recorder, typ events.Type, n int) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.GreaterOrEqual(c, len(rec.OfType(typ)), n, "%s events", typ)
	}, 60*time.Second, 10*time.Millisecond)
}

// readDLQ reads n records from the DLQ topic.
func (b *kafkaBundle) readDLQ(t *testing.T, n int) []*kgo.Record {
	t.Helper()
	return testenv.ReadRecords(t, b.brokers, b.names.DLQ, n)
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func TestHandledTriggersAreCommittedBadOnesGoToDLQAndTheNextIsProcessed(t *testing.T) {
	t.Parallel()
	b := setupKafka(t)
	h := newFake(nil)
	b.consumer(t, h, nil)

	orig := kgo.RecordHeader{Key: "traceparent", Value: []byte("00-abc-01")}
	first := b.produce(t, b.bills, "2026-11", `{"period":"2026-11","request_id":"req-1","requested_by":"ops"}`)
	bad := b.produce(t, b.bills, "2026-11", `{"period":"2026-11"`, orig)
	badPeriod := b.produce(t, b.bills, "2026-11", `{"period":"2026-13"}`)
	open := b.produce(t, b.bills, "2026-12", `{"period":"2026-12","force":true}`)
	twice := b.produce(t, b.bills, "2026-11", `{"period":"2026-11","period":"2026-10"}`)
	next := b.produce(t, b.bills, "2026-11", `{"period":"2026-11"}`)
	require.Equal(t, first.Partition, next.Partition, "one key, one partition")

	calls := h.waitCalls(t, 2)
	require.Equal(t, "2026-11", calls[0].period)
	require.Equal(t, job.Trigger{Source: job.SourceKafka, RequestID: "req-1", RequestedBy: "ops"}, calls[0].t)
	require.Equal(t, fmt.Sprintf("kafka-%s-%d-%d", next.Topic, next.Partition, next.Offset), calls[1].t.RequestID,
		"a missing request_id is derived from the record, deterministically")
	b.waitCommitted(t, next, next.Offset+1)

	dlq := map[string]*kgo.Record{} // by reason: the open month's key may sit on another partition
	for _, r := range b.readDLQ(t, 4) {
		dlq[header(r, "reason")] = r
	}
	require.Len(t, dlq, 4)
	mal := dlq["malformed_json"]
	require.NotNil(t, mal)
	require.Equal(t, []byte(`{"period":"2026-11"`), mal.Value, "original bytes")
	require.Equal(t, []byte("2026-11"), mal.Key)
	require.Equal(t, "00-abc-01", header(mal, "traceparent"), "original headers kept")
	require.Equal(t, b.bills, header(mal, "source-topic"))
	require.Equal(t, fmt.Sprint(bad.Partition), header(mal, "source-partition"))
	require.Equal(t, fmt.Sprint(bad.Offset), header(mal, "source-offset"))
	require.NotNil(t, dlq["bad_period"])
	require.Equal(t, fmt.Sprint(badPeriod.Offset), header(dlq["bad_period"], "source-offset"))
	// The open month, even forced: never billable.
	require.NotNil(t, dlq["period_not_closed"])
	require.Equal(t, []byte("2026-12"), dlq["period_not_closed"].Key)
	require.Equal(t, fmt.Sprint(open.Offset), header(dlq["period_not_closed"], "source-offset"))
	// A member given twice is neither of them (it was read last-wins).
	require.NotNil(t, dlq["duplicate_key"])
	require.Equal(t, fmt.Sprint(twice.Offset), header(dlq["duplicate_key"], "source-offset"))
	require.Contains(t, header(dlq["duplicate_key"], "reason-detail"), `"period"`)

	rejected := b.rec.OfType(events.TriggerRejected)
	require.Len(t, rejected, 4)
	keys := map[any]string{}
	for _, e := range rejected {
		keys[e.Extra["reason"]] = e.Key
		require.Equal(t, "kafka", e.Trigger)
		require.NotEmpty(t, e.Extra["detail"])
	}
	require.Equal(t, map[any]string{"malformed_json": "billrun:2026-11", "bad_period": "billrun:2026-11", "period_not_closed": "billrun:2026-12",
		"duplicate_key": "billrun:2026-11"}, keys)
}

// A trigger that decodes but whose run is refused on its input (an
// adjustment before the bill run COMPLETED) is wrong on every redelivery:
// it goes to the DLQ, like a record that does not decode, and the record
// behind it runs. It used to be committed with nothing but a run.failed
// event to show for it.
func TestRunRefusedOnItsInputGoesToDLQ(t *testing.T) {
	t.Parallel()
	b := setupKafka(t)
	h := newFake(func(n int, _ call) job.Outcome {
		if n == 0 {
			return job.OutcomeFailed
		}
		return job.OutcomeCompleted
	})
	h.failedOnInput = true
	b.consumer(t, h, nil)

	refused := b.produce(t, b.bills, "2026-10", `{"period":"2026-10","adjust":true}`)
	b.waitCommitted(t, refused, refused.Offset+1) // handled: dead-lettered, not retried
	next := b.produce(t, b.bills, "2026-10", `{"period":"2026-10"}`)
	b.waitCommitted(t, next, next.Offset+1)
	require.Len(t, h.waitCalls(t, 2), 2, "the refused trigger ran once, the next one ran")
	dlq := b.readDLQ(t, 1)
	require.Equal(t, owned.ReasonBadInput, header(dlq[0], "reason"))
	require.Equal(t, "period 2026-10 has no bill run: run it first", header(dlq[0], "reason-detail"))
	require.Equal(t, fmt.Sprint(refused.Offset), header(dlq[0], "source-offset"))
	require.Equal(t, refused.Value, dlq[0].Value)
	rejected := b.rec.OfType(events.TriggerRejected)
	require.Len(t, rejected, 1)
	require.Equal(t, owned.ReasonBadInput, rejected[0].Extra["reason"])
}

func TestUnavailableIsNotCommittedAndRetriedInOrder(t *testing.T) {
	t.Parallel()
	b := setupKafka(t)
	release := make(chan struct{})
	h := newFake(func(n int, c call) job.Outcome {
		if c.period == "2026-01" && n < 3 {
			return job.OutcomeUnavailable
		}
		if c.period == "2026-01" && n == 3 {
			<-release // the 4th try succeeds once the test looked at the offsets
		}
		return job.OutcomeCompleted
	})
	b.consumer(t, h, nil)

	first := b.produce(t, b.bills, "2026-01", `{"period":"2026-01","request_id":"a"}`)
	second := b.produce(t, b.bills, "2026-01", `{"period":"2026-01","request_id":"b"}`)

	calls := h.waitCalls(t, 4)
	for _, c := range calls {
		require.Equal(t, "a", c.t.RequestID, "the record behind an unhandled one waits")
	}
	require.Equal(t, int64(-1), b.committed(t, first), "not committed while the lock backend is unavailable")
	close(release)

	calls = h.waitCalls(t, 5)
	require.Equal(t, "b", calls[4].t.RequestID)
	b.waitCommitted(t, second, second.Offset+1)
	require.Empty(t, b.rec.OfType(events.TriggerRejected))
}

func TestSecondKindsTopicAndOversizedRecords(t *testing.T) {
	t.Parallel()
	b := setupKafka(t)
	h := newFake(nil)
	b.consumer(t, h, func(c *trigger.KafkaConfig) { c.MaxRecordBytes = 100 })

	big := b.produce(t, b.widgets, "", `{"n":1,"request_id":"big","requested_by":"`+strings.Repeat("x", 200)+`"}`)
	ok := b.produce(t, b.widgets, "", `{"n":2,"request_id":"sweep-1"}`)

	calls := h.waitCalls(t, 1)
	require.Equal(t, "widget", calls[0].job)
	require.Equal(t, 2, calls[0].n)
	require.Equal(t, "sweep-1", calls[0].t.RequestID)
	dlq := b.readDLQ(t, 1)
	require.Equal(t, "too_large", header(dlq[0], "reason"))
	require.Equal(t, big.Value, dlq[0].Value)
	if big.Partition == ok.Partition {
		b.waitCommitted(t, ok, ok.Offset+1)
	} else {
		b.waitCommitted(t, big, big.Offset+1)
		b.waitCommitted(t, ok, ok.Offset+1)
	}
	rejected := b.rec.OfType(events.TriggerRejected)
	require.Len(t, rejected, 1)
	require.Equal(t, "widget", rejected[0].Key, "a record whose key names no lock key: the kind's name")
}

func TestStopCancelsInFlightAfterDrainTimeoutWithoutCommitting(t *testing.T) {
	t.Parallel()
	b := setupKafka(t)
	h := newFake(nil)
	h.block = make(chan struct{}) // never closed: the run outlives the drain bound
	h.entered = make(chan struct{}, 1)
	c := b.consumer(t, h, func(c *trigger.KafkaConfig) { c.DrainTimeout = 300 * time.Millisecond })

	r := b.produce(t, b.bills, "2026-02", `{"period":"2026-02"}`)
	select {
	case <-h.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the record never reached the handler")
	}
	require.True(t, hasPartition(c.Lag(), r))
	c.Stop()
	c.Stop()
	calls := h.Calls()
	require.Len(t, calls, 1, "the in-flight run was cancelled and returned")
	require.Len(t, h.ctxErrs, 1)
	require.ErrorIs(t, h.ctxErrs[0], context.Canceled)
	require.Equal(t, int64(-1), b.committed(t, r), "a lost run is not committed: it is redelivered")
}

func hasPartition(lag map[string]int64, r *kgo.Record) bool {
	_, ok := lag[fmt.Sprintf("%s/%d", r.Topic, r.Partition)]
	return ok
}

func TestConsumerConfigErrors(t *testing.T) {
	t.Parallel()
	kinds := registry(t, &ownedtest.Widget{})
	_, err := trigger.NewKafkaConsumer(trigger.KafkaConfig{Replica: "r", Kinds: kinds}, newFake(nil), nil, nil, nil)
	require.ErrorContains(t, err, "Brokers")
	_, err = trigger.NewKafkaConsumer(trigger.KafkaConfig{Brokers: []string{"127.0.0.1:1"}, Kinds: kinds}, newFake(nil), nil, nil, nil)
	require.ErrorContains(t, err, "Replica")
	_, err = trigger.NewKafkaConsumer(trigger.KafkaConfig{Brokers: []string{"127.0.0.1:1"}, Replica: "r"}, newFake(nil), nil, nil, nil)
	require.ErrorContains(t, err, "Kinds")
	c, err := trigger.NewKafkaConsumer(trigger.KafkaConfig{Brokers: []string{"127.0.0.1:1"}, Replica: "r", Kinds: kinds}, newFake(nil), nil, nil, nil)
	require.NoError(t, err)
	c.Stop() // never started: returns at once
	require.ErrorContains(t, c.Start(context.Background()), "already started", "no Start after Stop")
}

// consumerWith is consumer with the consumer's metrics m.
func (b *kafkaBundle) consumerWith(t *testing.T, h trigger.Handler, m *trigger.Metrics) *trigger.KafkaConsumer {
	t.Helper()
	cfg := trigger.KafkaConfig{Brokers: b.brokers, Group: b.group, Kinds: b.kinds, Topics: b.names, Replica: "r1",
		RetryBackoffMin: 20 * time.Millisecond, RetryBackoffMax: 100 * time.Millisecond, FetchMaxWait: 100 * time.Millisecond}
	c, err := trigger.NewKafkaConsumer(cfg, h, b.rec, nil, m)
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(c.Stop)
	return c
}
