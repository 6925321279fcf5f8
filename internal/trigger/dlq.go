package trigger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// The dead-letter side of the consumer (kafka.go): a record that can never
// be run, or a batch too large to read, is copied, bounded, to the DLQ
// topic with its reason, announced by trigger.rejected, and committed.

// reject copies rec to the DLQ (see dlqRecord) and emits trigger.rejected:
// its subject is the lock key when the record's key names one
// (owned.Def.RecordLockKey), else the kind's name. It reports false when the DLQ
// could not be written, so the record is retried, not lost. The copy is
// bounded whatever the record's size, so a write fails for the DLQ's
// sake (unreachable, not authorised), never for the record's.
func (c *KafkaConsumer) reject(rec *kgo.Record, k owned.Kind, err error) bool {
	re := owned.RejectionOf(err)
	if !c.deadLetter(rec, dlqRecord(rec, c.cfg.Topics.DLQ, re.Reason, re.Detail)) {
		return false
	}
	c.m.reject(rec.Topic, re.Reason)
	jobName, key := "", "trigger:"+rec.Topic
	if k != nil {
		jobName, key = k.Spec().Name, k.Spec().Name
		if len(rec.Key) <= DLQMaxKeyBytes {
			if lk, ok := k.LockKeyOfRecord(rec.Key); ok {
				key = lk
			}
		}
	}
	c.emitRejected(rec, jobName, key, re.Reason, re.Detail)
	return true
}

// ReasonBatchTooLarge is the DLQ reason of a fetched batch that would
// decompress past KafkaConfig.MaxDecompressBatchBytes: it was not read, so
// its DLQ record carries its coordinates and no key or value.
const ReasonBatchTooLarge = "batch_too_large"

// rejectBatch dead-letters the coordinates of a batch franz-go refused to
// decompress (marker stands for it; see skipBatch) and emits
// trigger.rejected; false when the DLQ could not be written.
func (c *KafkaConsumer) rejectBatch(marker *kgo.Record, e *kgo.ErrDecompressTooLarge) bool {
	detail := fmt.Sprintf("the batch at offsets %d..%d decompresses to more than %d bytes (MaxDecompressBatchBytes); it was skipped unread",
		e.Offset, e.NextOffset-1, c.cfg.MaxDecompressBatchBytes)
	dlq := &kgo.Record{Topic: c.cfg.Topics.DLQ, Headers: []kgo.RecordHeader{
		{Key: "reason", Value: []byte(ReasonBatchTooLarge)},
		{Key: "reason-detail", Value: []byte(detail)},
		{Key: "source-topic", Value: []byte(e.Topic)},
		{Key: "source-partition", Value: []byte(strconv.Itoa(int(e.Partition)))},
		{Key: "source-offset", Value: []byte(strconv.FormatInt(e.Offset, 10))},
		{Key: "source-next-offset", Value: []byte(strconv.FormatInt(e.NextOffset, 10))},
	}}
	if !c.deadLetter(marker, dlq) {
		return false
	}
	c.m.reject(e.Topic, ReasonBatchTooLarge)
	jobName, key := "", "trigger:"+e.Topic
	if k := c.byTopic[e.Topic]; k != nil {
		jobName, key = k.Spec().Name, k.Spec().Name
	}
	batch := *marker
	batch.Offset = e.Offset // the event names the batch's first offset, like the DLQ record
	c.emitRejected(&batch, jobName, key, ReasonBatchTooLarge, detail)
	return true
}

// deadLetter writes dlq; false (logged, counted) when it could not.
func (c *KafkaConsumer) deadLetter(rec, dlq *kgo.Record) bool {
	ctx, cancel := context.WithTimeout(c.handleCtx, 10*time.Second)
	defer cancel()
	if perr := c.cl.ProduceSync(ctx, dlq).FirstErr(); perr != nil {
		c.m.dlqFailed(rec.Topic)
		c.log.Error("trigger_dlq_write_failed", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset,
			"dlq_bytes", len(dlq.Key)+len(dlq.Value), "error", perr)
		return false
	}
	return true
}

func (c *KafkaConsumer) emitRejected(rec *kgo.Record, jobName, key, reason, detail string) {
	c.emit.Emit(c.handleCtx, events.Event{
		Type: events.TriggerRejected, Key: key, Job: jobName, Replica: c.cfg.Replica, Trigger: string(job.SourceKafka),
		RequestID: derivedID(rec), TraceParent: recordTraceParent(rec),
		Extra: map[string]any{"reason": reason, "detail": detail, "topic": rec.Topic,
			"partition": rec.Partition, "offset": rec.Offset, "dlq_topic": c.cfg.Topics.DLQ},
	})
	c.log.Warn("trigger_rejected", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset,
		"reason", reason, "detail", detail)
}

// dlqRecord is the dead-letter copy of rec: its key, value and headers plus
// reason, reason-detail, source-topic, source-partition, source-offset,
// value-size, value-sha256 and value-truncated. It is bounded whatever rec's
// size: a value over DLQMaxValueBytes keeps its first DLQMaxValueBytes
// (value-truncated: true); a key over DLQMaxKeyBytes likewise, with
// key-size and key-sha256; original headers over DLQMaxHeaderBytes in all
// are left out and counted in headers-dropped.
func dlqRecord(rec *kgo.Record, topic, reason, detail string) *kgo.Record {
	headers := make([]kgo.RecordHeader, 0, len(rec.Headers)+11)
	hbytes := 0
	for _, h := range rec.Headers {
		hbytes += len(h.Key) + len(h.Value) + 10 // the lengths' varints, so that many tiny headers count too
	}
	if hbytes <= DLQMaxHeaderBytes {
		headers = append(headers, rec.Headers...)
	} else {
		headers = append(headers, kgo.RecordHeader{Key: "headers-dropped", Value: []byte(strconv.Itoa(len(rec.Headers)))})
	}
	value, vTrunc := truncated(rec.Value, DLQMaxValueBytes)
	vsum := sha256.Sum256(rec.Value)
	headers = append(headers,
		kgo.RecordHeader{Key: "reason", Value: []byte(reason)},
		kgo.RecordHeader{Key: "reason-detail", Value: []byte(detail)},
		kgo.RecordHeader{Key: "source-topic", Value: []byte(rec.Topic)},
		kgo.RecordHeader{Key: "source-partition", Value: []byte(strconv.Itoa(int(rec.Partition)))},
		kgo.RecordHeader{Key: "source-offset", Value: []byte(strconv.FormatInt(rec.Offset, 10))},
		kgo.RecordHeader{Key: "value-size", Value: []byte(strconv.Itoa(len(rec.Value)))},
		kgo.RecordHeader{Key: "value-sha256", Value: []byte(hex.EncodeToString(vsum[:]))},
		kgo.RecordHeader{Key: "value-truncated", Value: []byte(strconv.FormatBool(vTrunc))},
	)
	key, kTrunc := truncated(rec.Key, DLQMaxKeyBytes)
	if kTrunc {
		ksum := sha256.Sum256(rec.Key)
		headers = append(headers,
			kgo.RecordHeader{Key: "key-size", Value: []byte(strconv.Itoa(len(rec.Key)))},
			kgo.RecordHeader{Key: "key-sha256", Value: []byte(hex.EncodeToString(ksum[:]))},
		)
	}
	return &kgo.Record{Topic: topic, Key: key, Value: value, Headers: headers}
}

// truncated returns b's first n bytes and whether b was longer.
func truncated(b []byte, n int) ([]byte, bool) {
	if len(b) <= n {
		return b, false
	}
	return b[:n], true
}
