package telemetry

import (
	"context"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"github.com/twmb/franz-go/plugin/kprom"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
)

// KafkaTracing traces one franz-go client with kotel: a "publish" span per
// produced record (its traceparent written into the record's headers) and
// a "receive" span per fetched record (child of the record's traceparent).
// A nil *KafkaTracing (tracing off) installs nothing.
type KafkaTracing struct {
	kt   *kotel.Tracer
	hook *kotel.Kotel
	p    *Provider
}

// Kafka returns the tracing of a client in consumer group group ("" for a
// producer); nil when tracing is off.
func (p *Provider) Kafka(group string) *KafkaTracing {
	if !p.Enabled() {
		return nil
	}
	opts := []kotel.TracerOpt{kotel.TracerProvider(p.tp), kotel.TracerPropagator(p.prop)}
	if group != "" {
		opts = append(opts, kotel.ConsumerGroup(group))
	}
	kt := kotel.NewTracer(opts...)
	return &KafkaTracing{kt: kt, hook: kotel.NewKotel(kotel.WithTracer(kt)), p: p}
}

// Opts are the client options that install the hooks (none when off).
func (k *KafkaTracing) Opts() []kgo.Opt {
	if k == nil {
		return nil
	}
	return []kgo.Opt{kgo.WithHooks(k.hook.Hooks()...)}
}

// Process starts the span that handles a consumed record under ctx: kotel's
// "<topic> process", child of the record's "receive" span. Off, the span
// does nothing and ctx carries the record's W3C traceparent header, if any,
// as the remote parent: the run it starts reports that trace context in its
// events. The caller ends the span.
func (k *KafkaTracing) Process(ctx context.Context, rec *kgo.Record) (context.Context, trace.Span) {
	if k == nil {
		return Off().Extract(ctx, recordHeaders(rec)), noopSpan
	}
	_, span := k.kt.WithProcessSpan(rec)
	return trace.ContextWithSpan(ctx, span), span
}

func recordHeaders(rec *kgo.Record) HeaderCarrier {
	return func(key string) string {
		for _, h := range rec.Headers {
			if h.Key == key {
				return string(h.Value)
			}
		}
		return ""
	}
}

// KafkaMetrics are the client options that export one franz-go client's
// metrics through kprom on reg (coordinator_kafka_*: connects, bytes read
// and written, produce and fetch bytes, buffered records, with a client_id
// label so the replica's clients share one registry). Nil reg: none.
func KafkaMetrics(reg prometheus.Registerer) []kgo.Opt {
	if reg == nil {
		return nil
	}
	return []kgo.Opt{kgo.WithHooks(kprom.NewMetrics("coordinator", kprom.Subsystem("kafka"), kprom.Registerer(reg),
		kprom.WithClientLabel()))}
}

// kpromRenames are the kprom series named against Prometheus' conventions:
// gauges named like counters (promtool check metrics: "non-counter metrics
// should not have _total suffix"), which would mislead rate() and
// increase(). The /metrics handler serves them under Name instead
// (docs/observability.md).
var kpromRenames = []struct{ From, Name string }{
	{From: "coordinator_kafka_buffered_fetch_records_total", Name: "coordinator_kafka_buffered_fetch_records"},
	{From: "coordinator_kafka_buffered_produce_records_total", Name: "coordinator_kafka_buffered_produce_records"},
}

// Gatherer is g, with kprom's gauges named like counters renamed
// (kpromRenames): the replica's /metrics serves it.
func Gatherer(g prometheus.Gatherer) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := g.Gather()
		renamed := false
		for _, mf := range mfs {
			if mf.GetType() != dto.MetricType_GAUGE {
				continue
			}
			for _, r := range kpromRenames {
				if mf.GetName() == r.From {
					mf.Name = proto.String(r.Name)
					renamed = true
				}
			}
		}
		if renamed {
			sort.Slice(mfs, func(i, j int) bool { return mfs[i].GetName() < mfs[j].GetName() })
		}
		return mfs, err
	})
}
