package owned

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/telco-platform/coordinator/internal/job"
)

// metrics are the template's series, the same for every kind (prefix
// coordinator_run_). A nil *metrics records nothing.
type metrics struct {
	duration  *prometheus.HistogramVec
	executing *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "coordinator_run_duration_seconds",
			Help:    "Owned runs by kind (job) and outcome, from the trigger to the outcome, lock wait included.",
			Buckets: prometheus.ExponentialBuckets(0.005, 3, 12),
		}, []string{"job", "outcome"}),
		executing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "coordinator_run_executing",
			Help: "Owned runs of each kind this replica is executing now (lock held, work under way).",
		}, []string{"job"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.duration, m.executing} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("owned: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *metrics) ended(jobName string, o job.Outcome, took time.Duration) {
	if m != nil {
		m.duration.WithLabelValues(jobName, string(o)).Observe(took.Seconds())
	}
}

func (m *metrics) running(jobName string, delta float64) {
	if m != nil {
		m.executing.WithLabelValues(jobName).Add(delta)
	}
}
