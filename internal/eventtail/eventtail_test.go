package eventtail_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/eventtail"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// A subscriber that reads nothing loses events, counted, and never holds
// the fan-out up; the others get every event.
func TestSlowSubscriberDropsAloneAndNeverBlocks(t *testing.T) {
	t.Parallel()
	tail, err := eventtail.New(eventtail.Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t"})
	require.NoError(t, err)
	slow, fast := tail.Subscribe(2), tail.Subscribe(1000)
	start := time.Now()
	for range 1000 {
		tail.Publish([]byte(`{"type":"ownership.acquired","subject":"billrun:2026-01"}`))
	}
	require.Less(t, time.Since(start), time.Second)
	require.Equal(t, int64(998), slow.Dropped())
	require.Zero(t, fast.Dropped())
	require.Len(t, fast.C(), 1000)
	ev := <-fast.C()
	require.Equal(t, "billrun:2026-01", ev.Key)
	require.Equal(t, "ownership.acquired", ev.Type)
	tail.Publish([]byte(`not an event`))
	require.Len(t, fast.C(), 999, "not a CloudEvent: not fanned out")
	slow.Close()
	slow.Close()
	require.Equal(t, 1, tail.Subscribers())
	tail.Stop()
	for range fast.C() { // drained, then closed
	}
}

// The tail reads every partition with no group, from its start on.
func TestTailSeesEventsOfEveryPartition(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t)
	topic := k.Topic("coordinator.ownership.events")
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ProducerLinger(0))
	require.NoError(t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err = adm.CreateTopic(ctx, 3, 1, nil, topic)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), topic) })
	tail, err := eventtail.New(eventtail.Config{Brokers: k.Brokers, Topic: topic})
	require.NoError(t, err)
	require.NoError(t, tail.Start(ctx))
	defer tail.Stop()
	sub := tail.Subscribe(1000)
	keys := map[string]bool{}
	for _, key := range []string{"billrun:2026-01", "billrun:2026-02", "msisdn-reaper:sweep", "msisdn-pool:replenish"} {
		keys[key] = true
	}
	// Until the tail has listed a partition's offsets, a record produced
	// there may fall before its start (franz-go lists by time, then the
	// end, when nothing is that recent yet): each key not seen is produced
	// again, so what is proven is that every partition is read.
	for len(keys) > 0 {
		for key := range keys {
			v := `{"type":"ownership.acquired","subject":"` + key + `"}`
			require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(v)}).FirstErr())
		}
		again := time.After(2 * time.Second)
	wait:
		for len(keys) > 0 {
			select {
			case ev := <-sub.C():
				delete(keys, ev.Key)
			case <-again:
				break wait
			case <-ctx.Done():
				t.Fatalf("events not seen: %v", keys)
			}
		}
	}
}
