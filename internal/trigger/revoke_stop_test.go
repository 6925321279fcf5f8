package trigger_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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

// gateHandler holds each bill run until its period's gate is opened, and
// notes a run whose context was cancelled first.
type gateHandler struct {
	mu        sync.Mutex
	gates     map[string]chan struct{}
	cancelled []string
	entered   chan string
}

func (g *gateHandler) gate(period string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gates[period] == nil {
		g.gates[period] = make(chan struct{})
	}
	return g.gates[period]
}

func (g *gateHandler) Run(ctx context.Context, k owned.Kind, p owned.Params, _ job.Trigger) (job.Result, error) {
	_, period, _ := strings.Cut(k.LockKey(p), ":")
	g.entered <- period
	select {
	case <-g.gate(period):
		return job.Result{Job: k.Spec().Name, Outcome: job.OutcomeCompleted}, nil
	case <-ctx.Done():
		g.mu.Lock()
		g.cancelled = append(g.cancelled, period)
		g.mu.Unlock()
		return job.Result{Job: k.Spec().Name, Outcome: job.OutcomeLost}, nil
	}
}

// A run left going by a revoke (it outlived RevokeWait) is still a run in
// flight on this replica: Stop gives it the same DrainTimeout as the runs
// of the partitions it still owns, rather than cancelling it as soon as
// those are drained (failed before: Stop knew only the workers of its
// current partitions, and cancelled the left run at once).
func TestStopDrainsARunLeftByARevoke(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t)
	kb := &kafkaBundle{brokers: k.Brokers, group: "g-" + k.Suffix, kinds: registry(t, &ownedtest.Widget{})}
	kb.names = topics.New(k.Suffix, kb.kinds.Topics()...)
	kb.bills, kb.widgets = kb.names.Topic(billrun.Topic), kb.names.Topic(widgetTopic)
	var err error
	kb.adm, err = topics.Dial(k.Brokers)
	require.NoError(t, err)
	kb.prod, err = kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ProducerLinger(0))
	require.NoError(t, err)
	t.Cleanup(func() {
		kb.prod.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = kb.adm.DeleteGroup(ctx, kb.group)
		_, _ = kb.adm.DeleteTopics(ctx, kb.names.All()...)
		kb.adm.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = kb.adm.CreateTopics(ctx, 2, -1, nil, kb.bills)
	require.NoError(t, err)
	_, err = kb.adm.CreateTopics(ctx, 1, -1, nil, kb.names.DLQ)
	require.NoError(t, err)

	h1 := &gateHandler{gates: map[string]chan struct{}{}, entered: make(chan string, 10)}
	kb.rec = &events.Recorder{}
	c1 := kb.consumer(t, h1, func(c *trigger.KafkaConfig) {
		c.Replica = "r1"
		c.RevokeWait = 300 * time.Millisecond
		c.DrainTimeout = 60 * time.Second
	})

	byPeriod := map[string]*kgo.Record{}
	var recs []*kgo.Record
	for _, p := range []int32{0, 1} {
		period := fmt.Sprintf("2026-%02d", p+1)
		r := &kgo.Record{Topic: kb.bills, Partition: p, Key: []byte(period), Value: []byte(`{"period":"` + period + `"}`)}
		recs = append(recs, r)
		byPeriod[period] = r
	}
	manual, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	require.NoError(t, err)
	defer manual.Close()
	require.NoError(t, manual.ProduceSync(ctx, recs...).FirstErr())
	for range 2 {
		select {
		case <-h1.entered:
		case <-time.After(30 * time.Second):
			t.Fatal("r1 did not start both runs")
		}
	}

	// r2 joins and takes one partition; r1's run of it goes on (RevokeWait
	// is short), left by the revoke.
	h2 := newFake(func(int, call) job.Outcome { return job.OutcomeAlreadyOwned })
	kb.consumer(t, h2, func(c *trigger.KafkaConfig) { c.Replica = "r2" })
	moved := h2.waitCalls(t, 1)[0].period
	kept := "2026-01"
	if moved == kept {
		kept = "2026-02"
	}
	kb.waitCommitted(t, byPeriod[moved], byPeriod[moved].Offset+1)

	// r1 stops. Its kept partition's run ends and is committed: Stop has
	// drained its own partitions, and must still wait for the left run.
	stopped := make(chan struct{})
	go func() { defer close(stopped); c1.Stop() }()
	close(h1.gate(kept))
	kb.waitCommitted(t, byPeriod[kept], byPeriod[kept].Offset+1)
	close(h1.gate(moved))
	select {
	case <-stopped:
	case <-time.After(60 * time.Second):
		t.Fatal("r1's Stop did not return")
	}
	h1.mu.Lock()
	defer h1.mu.Unlock()
	require.Empty(t, h1.cancelled, "runs cancelled by Stop within its DrainTimeout")
}
