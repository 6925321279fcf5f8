package trigger_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/trigger"
)

// bigProducer is a producer whose own record limit does not stop the
// oversized test records (the broker's limit, message.max.bytes, is about
// 1 MiB; a record over it could not reach the topic in the first place).
func (b *kafkaBundle) bigProducer(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.brokers...), kgo.ProducerLinger(0),
		kgo.ProducerBatchMaxBytes(16 << 20)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func produceWith(t *testing.T, cl *kgo.Client, r *kgo.Record) *kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(ctx, r).FirstErr())
	return r
}

// A trigger over the producer's limit (~1 MB) cannot be copied to the DLQ
// as it is: it used to be retried forever and the valid trigger behind it
// on its partition never ran (RELIABILITY.md #5, issue 13 item 3).
func TestOversizedRecordGoesToDLQTruncatedAndTheNextRuns(t *testing.T) {
	t.Parallel()
	b := setupKafka(t)
	h := newFake(nil)
	b.consumer(t, h, nil)

	pad := strings.Repeat("x", 1_020_000-len(`{"period":"2026-11","pad":""}`))
	value := []byte(`{"period":"2026-11","pad":"` + pad + `"}`)
	require.Len(t, value, 1_020_000)
	orig := kgo.RecordHeader{Key: "traceparent", Value: []byte("00-abc-01")}
	big := produceWith(t, b.bigProducer(t), &kgo.Record{Topic: b.bills, Key: []byte("2026-11"), Value: value, Headers: []kgo.RecordHeader{orig}})
	next := b.produce(t, b.bills, "2026-11", `{"period":"2026-11","request_id":"after-the-big-one"}`)
	require.Equal(t, big.Partition, next.Partition, "one key, one partition")

	calls := h.waitCalls(t, 1)
	require.Equal(t, "after-the-big-one", calls[0].t.RequestID, "the valid trigger behind the oversized one runs")
	b.waitCommitted(t, next, next.Offset+1)

	dlq := b.readDLQ(t, 1)[0]
	require.Equal(t, "too_large", header(dlq, "reason"))
	require.True(t, bytes.Equal(value[:trigger.DLQMaxValueBytes], dlq.Value), "the first 64 KiB of the value (got %d bytes)", len(dlq.Value))
	require.Equal(t, "1020000", header(dlq, "value-size"))
	sum := sha256.Sum256(value)
	require.Equal(t, hex.EncodeToString(sum[:]), header(dlq, "value-sha256"))
	require.Equal(t, "true", header(dlq, "value-truncated"))
	require.Equal(t, "00-abc-01", header(dlq, "traceparent"), "original headers kept")
	require.Equal(t, []byte("2026-11"), dlq.Key)
	require.Equal(t, fmt.Sprint(big.Offset), header(dlq, "source-offset"))

	rejected := b.rec.OfType(events.TriggerRejected)
	require.Len(t, rejected, 1)
	require.Equal(t, "too_large", rejected[0].Extra["reason"])
}

// A key or headers of any size do not make the dead-letter copy too large
// either: a key over 4 KiB is truncated like the value, headers over 64 KiB
// are left out (their count is said). 700 KB of key and 300 KB of headers
// made the copy exceed the producer's limit.
func TestOversizedKeyAndHeadersAreBoundedInTheDLQ(t *testing.T) {
	t.Parallel()
	b := setupKafka(t)
	h := newFake(nil)
	b.consumer(t, h, nil)

	key := bytes.Repeat([]byte("k"), 700_000)
	hdrs := []kgo.RecordHeader{{Key: "h1", Value: bytes.Repeat([]byte("v"), 150_000)}, {Key: "h2", Value: bytes.Repeat([]byte("w"), 150_000)}}
	big := produceWith(t, b.bigProducer(t), &kgo.Record{Topic: b.widgets, Key: key, Value: []byte(`{"n":`), Headers: hdrs})
	ok := produceWith(t, b.bigProducer(t), &kgo.Record{Topic: b.widgets, Key: key, Value: []byte(`{"n":2,"request_id":"ok"}`)})
	require.Equal(t, big.Partition, ok.Partition)
	require.Equal(t, "ok", h.waitCalls(t, 1)[0].t.RequestID)
	b.waitCommitted(t, ok, ok.Offset+1)

	dlq := b.readDLQ(t, 1)[0]
	require.Equal(t, "malformed_json", header(dlq, "reason"))
	require.Equal(t, trigger.DLQMaxKeyBytes, len(dlq.Key))
	require.Equal(t, "700000", header(dlq, "key-size"))
	sum := sha256.Sum256(key)
	require.Equal(t, hex.EncodeToString(sum[:]), header(dlq, "key-sha256"))
	require.Equal(t, "2", header(dlq, "headers-dropped"))
	require.Empty(t, header(dlq, "h1"))
	require.Equal(t, `{"n":`, string(dlq.Value), "a small value is kept whole")
	require.Equal(t, "false", header(dlq, "value-truncated"))
}

// A compressed batch that would decompress past MaxDecompressBatchBytes
// stops franz-go consuming the partition (ErrDecompressTooLarge) until the
// offset is moved past it: the consumer dead-letters the batch's
// coordinates, commits past it, and the next trigger runs.
func TestBatchOverDecompressLimitIsSkippedToDLQ(t *testing.T) {
	t.Parallel()
	b := setupKafka(t)
	h := newFake(nil)
	b.consumer(t, h, func(c *trigger.KafkaConfig) { c.MaxDecompressBatchBytes = 1 << 20 })

	zp := b.bigProducer(t, kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	bomb := produceWith(t, zp, &kgo.Record{Topic: b.bills, Key: []byte("2026-10"), Value: make([]byte, 4<<20)})
	next := produceWith(t, zp, &kgo.Record{Topic: b.bills, Key: []byte("2026-10"), Value: []byte(`{"period":"2026-10","request_id":"after-the-bomb"}`)})
	require.Equal(t, bomb.Partition, next.Partition)

	calls := h.waitCalls(t, 1)
	require.Equal(t, "after-the-bomb", calls[0].t.RequestID)
	b.waitCommitted(t, next, next.Offset+1)

	dlq := b.readDLQ(t, 1)[0]
	require.Equal(t, "batch_too_large", header(dlq, "reason"))
	require.Equal(t, b.bills, header(dlq, "source-topic"))
	require.Equal(t, fmt.Sprint(bomb.Partition), header(dlq, "source-partition"))
	require.Equal(t, fmt.Sprint(bomb.Offset), header(dlq, "source-offset"))
	require.Equal(t, fmt.Sprint(bomb.Offset+1), header(dlq, "source-next-offset"))
	require.Empty(t, dlq.Value, "the batch could not be read: only its coordinates")
	rejected := b.rec.OfType(events.TriggerRejected)
	require.Len(t, rejected, 1)
	require.Equal(t, "batch_too_large", rejected[0].Extra["reason"])
}

// counterOf sums the series of a counter family in reg.
func counterOf(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// A DLQ that cannot be written is visible (coordinator_trigger_dlq_write_failures_total,
// alert CoordinatorTriggerDLQUnwritable): the record is retried, not committed.
func TestDLQWriteFailureIsCountedAndNotCommitted(t *testing.T) {
	t.Parallel()
	b := setupKafka(t)
	b.names.DLQ = "not a valid topic name" // the broker refuses every write to it
	reg := prometheus.NewRegistry()
	b.consumerWith(t, newFake(nil), trigger.NewMetrics(reg))

	bad := b.produce(t, b.bills, "2026-11", `{"period":`)
	require.Eventually(t, func() bool {
		return counterOf(t, reg, "coordinator_trigger_dlq_write_failures_total") >= 2
	}, 60*time.Second, 20*time.Millisecond, "failed DLQ writes are counted, each retry again")
	require.Equal(t, int64(-1), b.committed(t, bad), "a record that could not be dead-lettered is not committed")
	require.Zero(t, counterOf(t, reg, "coordinator_trigger_rejected_total"))
}
