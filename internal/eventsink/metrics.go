package eventsink

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the sink's Prometheus metrics; a nil *Metrics records nothing.
type Metrics struct {
	dropped   prometheus.Counter
	buffered  prometheus.Gauge
	published prometheus.Counter
	errors    prometheus.Counter
}

// NewMetrics registers the sink's metrics on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "coordinator_events_dropped_total",
			Help: "Ownership events dropped because the bounded buffer was full or the sink stopped."}),
		buffered: prometheus.NewGauge(prometheus.GaugeOpts{Name: "coordinator_events_buffered",
			Help: "Ownership events waiting to be published (buffered plus in flight)."}),
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "coordinator_events_published_total",
			Help: "Ownership events acknowledged by Kafka."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "coordinator_events_publish_errors_total",
			Help: "Publish attempts that failed (the event is retried)."}),
	}
	if reg != nil {
		reg.MustRegister(m.dropped, m.buffered, m.published, m.errors)
	}
	return m
}

func (m *Metrics) drop(n int) {
	if m != nil && n > 0 {
		m.dropped.Add(float64(n))
	}
}

func (m *Metrics) setBuffered(n int) {
	if m != nil {
		m.buffered.Set(float64(n))
	}
}

func (m *Metrics) ok() {
	if m != nil {
		m.published.Inc()
	}
}

func (m *Metrics) failed() {
	if m != nil {
		m.errors.Inc()
	}
}
