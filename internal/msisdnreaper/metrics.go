package msisdnreaper

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the reaper's Prometheus series (prefix coordinator_reaper_). A
// nil *Metrics records nothing.
type Metrics struct {
	sweeps        *prometheus.CounterVec
	freed         prometheus.Counter
	batches       prometheus.Counter
	batchSeconds  prometheus.Histogram
	sweepSeconds  prometheus.Histogram
	deadlineStops prometheus.Counter
	lastSweep     prometheus.Gauge
}

// NewMetrics builds the series and registers them with reg (nil: not
// registered, still usable).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinator_reaper_sweeps_total",
			Help: "Sweep attempts on this replica by outcome (completed, already_owned, unavailable, lost, failed).",
		}, []string{"outcome"}),
		freed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordinator_reaper_freed_total",
			Help: "Stale reservations freed (RESERVED -> FREE) by this replica.",
		}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordinator_reaper_batches_total",
			Help: "Batch transactions committed by this replica's sweeps.",
		}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "coordinator_reaper_batch_seconds",
			Help:    "Duration of one batch transaction.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		sweepSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "coordinator_reaper_sweep_seconds",
			Help:    "Duration of an owned sweep, from lock acquired to the last batch.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		deadlineStops: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordinator_reaper_deadline_stops_total",
			Help: "Sweeps that stopped starting batches at the lease's local deadline, leaving the rest to the next tick.",
		}),
		lastSweep: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "coordinator_reaper_last_completed_sweep_timestamp_seconds",
			Help: "Unix time of the last sweep this replica completed.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.sweeps, m.freed, m.batches, m.batchSeconds, m.sweepSeconds, m.deadlineStops, m.lastSweep)
	}
	return m
}

func (m *Metrics) sweep(outcome string) {
	if m != nil {
		m.sweeps.WithLabelValues(outcome).Inc()
	}
}

func (m *Metrics) batch(freed int64, took time.Duration) {
	if m != nil {
		m.batches.Inc()
		m.freed.Add(float64(freed))
		m.batchSeconds.Observe(took.Seconds())
	}
}

func (m *Metrics) owned(took time.Duration, deadlineStop, completed bool) {
	if m == nil {
		return
	}
	m.sweepSeconds.Observe(took.Seconds())
	if deadlineStop {
		m.deadlineStops.Inc()
	}
	if completed {
		m.lastSweep.SetToCurrentTime()
	}
}
