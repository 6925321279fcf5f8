package trigger

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/telco-platform/coordinator/internal/job"
)

// Metrics are the trigger sources' and the dispatcher's Prometheus metrics
// (prefix coordinator_trigger_). A nil *Metrics records nothing.
type Metrics struct {
	outcomes *prometheus.CounterVec
	rejected *prometheus.CounterVec
	retries  *prometheus.CounterVec
	dlqFails *prometheus.CounterVec
	lag      *prometheus.GaugeVec
	running  prometheus.Gauge
	panics   *prometheus.CounterVec
	catchUps *prometheus.CounterVec
}

// NewMetrics registers the metrics on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "coordinator_trigger_outcomes_total",
			Help: "Triggers dispatched, by source, job and outcome."}, []string{"source", "job", "outcome"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "coordinator_trigger_rejected_total",
			Help: "Kafka trigger records sent to the dead-letter topic, by reason."}, []string{"topic", "reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "coordinator_trigger_retries_total",
			Help: "Kafka trigger records retried because they were not handled (lock backend unavailable, ownership lost, DLQ unreachable)."},
			[]string{"topic"}),
		dlqFails: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "coordinator_trigger_dlq_write_failures_total",
			Help: "Writes to the dead-letter topic that failed, by source topic (the record is retried; its partition waits)."},
			[]string{"topic"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "coordinator_trigger_consumer_lag",
			Help: "Records after the last handled one, per trigger topic partition (high watermark of the last fetch; updated on every fetch and commit)."},
			[]string{"topic", "partition"}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{Name: "coordinator_trigger_runs_in_flight",
			Help: "Owned runs the dispatcher is executing."}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "coordinator_trigger_cron_panics_total",
			Help: "Cron ticks that panicked (recovered and logged; the replica goes on), by job."}, []string{"job"}),
		catchUps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "coordinator_trigger_cron_catchups_total",
			Help: "Missed cron ticks run at start (COORDINATOR_CRON_CATCHUP_WINDOW), by job."}, []string{"job"}),
	}
	if reg != nil {
		reg.MustRegister(m.outcomes, m.rejected, m.retries, m.dlqFails, m.lag, m.running, m.panics, m.catchUps)
	}
	return m
}

func (m *Metrics) outcome(src job.Source, jobName string, o job.Outcome) {
	if m != nil {
		m.outcomes.WithLabelValues(string(src), jobName, string(o)).Inc()
	}
}

func (m *Metrics) reject(topic, reason string) {
	if m != nil {
		m.rejected.WithLabelValues(topic, reason).Inc()
	}
}

func (m *Metrics) retry(topic string) {
	if m != nil {
		m.retries.WithLabelValues(topic).Inc()
	}
}

func (m *Metrics) dlqFailed(topic string) {
	if m != nil {
		m.dlqFails.WithLabelValues(topic).Inc()
	}
}

func (m *Metrics) setLag(topic string, partition int32, lag int64) {
	if m != nil {
		m.lag.WithLabelValues(topic, strconv.Itoa(int(partition))).Set(float64(max(lag, 0)))
	}
}

func (m *Metrics) deleteLag(topic string, partition int32) {
	if m != nil {
		m.lag.DeleteLabelValues(topic, strconv.Itoa(int(partition)))
	}
}

func (m *Metrics) runs(delta float64) {
	if m != nil {
		m.running.Add(delta)
	}
}

func (m *Metrics) cronPanic(jobName string) {
	if m != nil {
		m.panics.WithLabelValues(jobName).Inc()
	}
}

func (m *Metrics) cronCatchUp(jobName string) {
	if m != nil {
		m.catchUps.WithLabelValues(jobName).Inc()
	}
}
