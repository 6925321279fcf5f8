package trigger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/topics"
	"github.com/telco-platform/coordinator/internal/trigger"
)

// A partition that moves to another replica while its trigger runs: the run
// is not cancelled (the lock decides who works), its offset is not committed
// by the old owner, and the new owner gets the trigger again.
func TestRevokedPartitionDoesNotCancelTheRunAndIsRedelivered(t *testing.T) {
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
	// Only the bill-run topic, with two partitions: a second member must take one.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = kb.adm.CreateTopics(ctx, 2, -1, nil, kb.bills)
	require.NoError(t, err)
	_, err = kb.adm.CreateTopics(ctx, 1, -1, nil, kb.names.DLQ)
	require.NoError(t, err)

	h1 := newFake(nil)
	h1.block = make(chan struct{})
	h1.entered = make(chan struct{}, 10)
	kb.rec = &events.Recorder{}
	c1 := kb.consumer(t, h1, func(c *trigger.KafkaConfig) { c.Replica = "r1"; c.RevokeWait = 300 * time.Millisecond })

	// One trigger on each partition; r1 starts both runs, which block.
	var recs []*kgo.Record
	for _, p := range []int32{0, 1} {
		period := fmt.Sprintf("2026-%02d", p+1)
		r := &kgo.Record{Topic: kb.bills, Partition: p, Key: []byte(period),
			Value: []byte(`{"period":"` + period + `"}`)}
		recs = append(recs, r)
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

	// r2 joins: one partition moves to it, with its run still going on r1.
	h2 := newFake(func(int, call) job.Outcome { return job.OutcomeAlreadyOwned })
	kb.consumer(t, h2, func(c *trigger.KafkaConfig) { c.Replica = "r2" })
	calls := h2.waitCalls(t, 1)
	require.Equal(t, job.SourceKafka, calls[0].t.Source)

	// The moved trigger was redelivered (r1 had not committed it) and r2,
	// finding it owned, committed it.
	moved := recs[0]
	if calls[0].period == "2026-02" {
		moved = recs[1]
	}
	kb.waitCommitted(t, moved, moved.Offset+1)

	h1.mu.Lock()
	require.Empty(t, h1.ctxErrs, "r1's runs were not cancelled by the revoke")
	h1.mu.Unlock()
	close(h1.block) // r1's runs finish
	h1.waitCalls(t, 2)
	c1.Stop()
}
