package trigger_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/eventsink"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/topics"
	"github.com/telco-platform/coordinator/internal/trigger"
)

// BenchmarkTriggerToAcquired measures, on the real broker, Redis and
// Postgres, the time from producing a bill-run trigger to consuming its
// ownership.acquired event from the events topic: Kafka consumer, decode,
// dispatcher, Redis lock, Postgres claim, event sink, and the watcher's
// fetch. One trigger at a time, each for its own period; the run completes
// (10 subscribers) before the next trigger is produced. Reports p50/p99/max.
//
//	go test -run '^$' -bench TriggerToAcquired -benchtime 200x ./internal/trigger/
func BenchmarkTriggerToAcquired(b *testing.B) {
	k := testenv.Kafka(b)
	// A clock in the year 3000: every period the benchmark triggers
	// (2100-01 on) is closed, and none is too old.
	bills := billrun.New(billrun.Config{Calendar: billrun.Calendar{MaxAgeMonths: 12000,
		Now: func() time.Time { return time.Date(3000, time.January, 1, 0, 0, 0, 0, time.UTC) }}})
	kinds, err := owned.NewRegistry(bills)
	require.NoError(b, err)
	names := topics.New(k.Suffix, kinds.Topics()...)
	adm, err := topics.Dial(k.Brokers)
	require.NoError(b, err)
	defer adm.Close()
	ctx := context.Background()
	require.NoError(b, topics.Ensure(ctx, adm, names, true))
	defer func() { _, _ = adm.DeleteTopics(ctx, names.All()...) }()

	pg := testenv.Postgres(b)
	_, err = billrun.Seed(ctx, pg.Pool, billrun.SeedConfig{Subscribers: 10})
	require.NoError(b, err)
	rd := testenv.Redis(b)
	rc, err := redislock.NewClient(rd.URL, "single")
	require.NoError(b, err)
	defer rc.Close()
	locker, err := redislock.New(rc, redislock.Config{Prefix: rd.Prefix, Owner: "bench-1"})
	require.NoError(b, err)
	defer locker.Close()

	sink, err := eventsink.New(eventsink.Config{Brokers: k.Brokers, Topic: names.Events})
	require.NoError(b, err)
	require.NoError(b, sink.Start(ctx))
	defer sink.Stop()
	runner, err := owned.NewRunner(kinds, owned.RunnerConfig{Deps: owned.Deps{DB: pg.Pool, Locker: locker}, Replica: "bench-1", Emit: sink})
	require.NoError(b, err)
	d := trigger.NewDispatcher(trigger.DispatcherConfig{Runner: runner})
	defer d.Shutdown(ctx)
	cons, err := trigger.NewKafkaConsumer(trigger.KafkaConfig{Brokers: k.Brokers, Group: "g-" + k.Suffix, Kinds: kinds, Topics: names, Replica: "bench-1"},
		d, sink, nil, nil)
	require.NoError(b, err)
	require.NoError(b, cons.Start(ctx))
	defer cons.Stop()

	watch, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ConsumeTopics(names.Events),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(time.Second))
	require.NoError(b, err)
	defer watch.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ProducerLinger(0))
	require.NoError(b, err)
	defer prod.Close()

	// waitFor polls the events topic until an event of type typ for key
	// showed; events seen earlier are remembered (one poll may bring several).
	seen := map[string]time.Time{}
	emitted := map[string]time.Time{} // the event's own time: when the replica emitted it
	waitFor := func(typ events.Type, key string) time.Time {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		for {
			if at, ok := seen[string(typ)+" "+key]; ok {
				return at
			}
			fs := watch.PollFetches(wctx)
			require.NoError(b, wctx.Err(), "no %s for %s", typ, key)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				var ce events.CloudEvent
				if json.Unmarshal(r.Value, &ce) == nil {
					seen[string(ce.Type)+" "+ce.Subject] = now
					emitted[string(ce.Type)+" "+ce.Subject] = ce.Time
				}
			})
		}
	}

	// Warm up: the group join and first metadata loads are not what we measure.
	trig := func(i int) (string, time.Time) {
		p := fmt.Sprintf("%04d-%02d", 2100+i/12, i%12+1)
		start := time.Now()
		r := &kgo.Record{Topic: names.Topic(billrun.Topic), Key: []byte(p), Value: []byte(`{"period":"` + p + `"}`)}
		require.NoError(b, prod.ProduceSync(ctx, r).FirstErr())
		return "billrun:" + p, start
	}
	key, _ := trig(0)
	waitFor(events.RunCompleted, key)

	lat := make([]time.Duration, 0, b.N)
	toEmit := make([]time.Duration, 0, b.N) // produced -> event emitted (consumer, dispatch, lock, claim)
	b.ResetTimer()
	for i := range b.N {
		key, start := trig(i + 1)
		lat = append(lat, waitFor(events.OwnershipAcquired, key).Sub(start))
		toEmit = append(toEmit, emitted[string(events.OwnershipAcquired)+" "+key].Sub(start))
		b.StopTimer()
		waitFor(events.RunCompleted, key)
		b.StartTimer()
	}
	b.StopTimer()
	q := func(d []time.Duration, f float64) float64 {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return float64(d[min(len(d)-1, int(f*float64(len(d))))]) / 1e6
	}
	b.ReportMetric(q(lat, 0.50), "p50-ms")
	b.ReportMetric(q(lat, 0.99), "p99-ms")
	b.ReportMetric(q(toEmit, 0.50), "emit-p50-ms")
	b.ReportMetric(q(toEmit, 0.99), "emit-p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1])/1e6, "max-ms")
	b.ReportMetric(0, "ns/op")
}
