package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// readTopic reads every record of topic, from the start to the end offsets
// of the moment it is called.
func readTopic(ctx context.Context, brokers []string, topic string) ([]*kgo.Record, error) {
	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, err
	}
	defer admCl.Close()
	ends, err := kadm.NewClient(admCl).ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	if len(want) == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond),
		kgo.FetchMaxBytes(32<<20), kgo.FetchMaxPartitionBytes(8<<20))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []*kgo.Record
	next := map[int32]int64{}
	for {
		done := true
		for p, end := range want {
			if next[p] < end {
				done = false
			}
		}
		if done {
			return out, nil
		}
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return out, fmt.Errorf("read %s: %w (%d records so far)", topic, ctx.Err(), len(out))
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < want[r.Partition] {
				out = append(out, r)
			}
			next[r.Partition] = max(next[r.Partition], r.Offset+1)
		})
	}
}

type cloudEvent struct {
	ID      string         `json:"id"`
	Type    string         `json:"type"`
	Subject string         `json:"subject"`
	Time    time.Time      `json:"time"`
	Data    map[string]any `json:"data"`
}

func readEvents(ctx context.Context, brokers []string) ([]Event, error) {
	recs, err := readTopic(ctx, brokers, topicEvents)
	if err != nil {
		return nil, err
	}
	out := make([]Event, 0, len(recs))
	for _, rec := range recs {
		var ce cloudEvent
		if json.Unmarshal(rec.Value, &ce) != nil {
			continue
		}
		str := func(k string) string { s, _ := ce.Data[k].(string); return s }
		num := func(k string) (int64, bool) { f, ok := ce.Data[k].(float64); return int64(f), ok }
		e := Event{ID: ce.ID, Type: ce.Type, Subject: ce.Subject, Time: ce.Time, Replica: str("replica"), Trigger: str("trigger"),
			RequestID: str("request_id"), Owner: str("owner"), Reason: str("reason"), Error: str("error"),
			Offset: rec.Offset, Partition: rec.Partition}
		e.Fence, _ = num("fence")
		e.LockFence, e.HasLock = num("lock_fence")
		e.PeriodInvoices, e.HasPeriodInvoices = num("period_invoices_created")
		e.Repaired, _ = num("repaired")
		out = append(out, e)
	}
	return out, nil
}

func readDLQ(ctx context.Context, brokers []string) ([]DLQRecord, error) {
	recs, err := readTopic(ctx, brokers, topicDLQ)
	if err != nil {
		return nil, err
	}
	out := make([]DLQRecord, 0, len(recs))
	for _, rec := range recs {
		d := DLQRecord{Size: len(rec.Value), SourcePartition: -1, SourceOffset: -1}
		for _, h := range rec.Headers {
			switch h.Key {
			case "source-topic":
				d.SourceTopic = string(h.Value)
			case "source-partition":
				if n, err := strconv.ParseInt(string(h.Value), 10, 32); err == nil {
					d.SourcePartition = int32(n)
				}
			case "source-offset":
				if n, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
					d.SourceOffset = n
				}
			case "reason":
				d.Reason = string(h.Value)
			}
		}
		d.Prefix = string(rec.Value[:min(len(rec.Value), 256)])
		out = append(out, d)
	}
	return out, nil
}
