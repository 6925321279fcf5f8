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
	// cronRetries and cronDrops: ticks run again because they were
	// neither done nor durable, and ticks given up (retryTickUntilDurable).
	cronRetries *prometheus.CounterVec
	cronDrops   *prometheus.CounterVec
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
		cronRetries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "coordinator_trigger_cron_retries_total",
			Help: "Cron ticks run again because their run neither finished nor was recorded for the resumer (e.g. Postgres down), by job."},
			[]string{"job"}),
		cronDrops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "coordinator_trigger_cron_ticks_dropped_total",
			Help: "Cron ticks this replica gave up before their run finished or was recorded for the resumer, by job and reason (next_tick: the next tick was due; shutdown)."},
			[]string{"job", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.outcomes, m.rejected, m.retries, m.dlqFails, m.lag, m.running, m.panics, m.catchUps,
			m.cronRetries, m.cronDrops)
	}
	return m
}

// cronJob creates the series of a scheduled job at 0, so that an alert's
// increase() sees its first tick that panics or is dropped: a counter that
// first appears at 1 has no increase.
func (m *Metrics) cronJob(jobName string) {
	if m == nil {
		return
	}
	m.panics.WithLabelValues(jobName)
	m.catchUps.WithLabelValues(jobName)
	m.cronRetries.WithLabelValues(jobName)
	for _, reason := range []string{DropNextTick, DropShutdown} {
		m.cronDrops.WithLabelValues(jobName, reason)
	}
}

// topic creates a trigger topic's series at 0 (see cronJob): retries, DLQ
// write failures, and a rejection for each reason its kind can give.
func (m *Metrics) topic(topic string, reasons []string) {
	if m == nil {
		return
	}
	m.retries.WithLabelValues(topic)
	m.dlqFails.WithLabelValues(topic)
	for _, reason := range reasons {
		m.rejected.WithLabelValues(topic, reason)
	}
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

func (m *Metrics) cronRetry(jobName string) {
	if m != nil {
		m.cronRetries.WithLabelValues(jobName).Inc()
	}
}

func (m *Metrics) cronDropped(jobName, reason string) {
	if m != nil {
		m.cronDrops.WithLabelValues(jobName, reason).Inc()
	}
}

func (m *Metrics) cronCatchUp(jobName string) {
	if m != nil {
		m.catchUps.WithLabelValues(jobName).Inc()
	}
}
