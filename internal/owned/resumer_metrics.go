package owned

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// resumerMetrics are the resumer's series.
type resumerMetrics struct {
	oldest     *prometheus.GaugeVec
	incomplete *prometheus.GaugeVec
	attempts   *prometheus.CounterVec
	gaveUp     *prometheus.CounterVec
	// republished counts the run.completed events this replica published
	// again (Worker.Completions).
	republished *prometheus.CounterVec
}

func newResumerMetrics(reg prometheus.Registerer) (*resumerMetrics, error) {
	m := &resumerMetrics{
		oldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "coordinator_incomplete_run_oldest_age_seconds",
			Help: "Age of the oldest accepted run of each kind that has not completed (run_requests, as of the resumer's last scan); 0 when none.",
		}, []string{"job"}),
		incomplete: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "coordinator_incomplete_runs",
			Help: "Accepted runs of each kind not completed, as of the resumer's last scan: pending (the resumer retries them) or permanent (failed for good or attempts spent: a person must act).",
		}, []string{"job", "state"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinator_resume_attempts_total",
			Help: "Resume attempts of this replica by kind and outcome.",
		}, []string{"job", "outcome"}),
		gaveUp: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinator_resume_gave_up_total",
			Help: "Requests this replica's resumer made permanent (attempts spent, a permanent failure, or a request that no longer decodes).",
		}, []string{"job"}),
		republished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinator_events_republished_total",
			Help: "run.completed events this replica's resumer published again because no acknowledgement of them was recorded within COORDINATOR_EVENTS_REPUBLISH_AFTER (same event id).",
		}, []string{"job"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.oldest, m.incomplete, m.attempts, m.gaveUp, m.republished} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("owned: register resumer metrics: %w", err)
			}
		}
	}
	return m, nil
}

// reset shows a kind's series before its first scan.
func (m *resumerMetrics) reset(name string) {
	m.oldest.WithLabelValues(name).Set(0)
	m.incomplete.WithLabelValues(name, "pending").Set(0)
	m.incomplete.WithLabelValues(name, "permanent").Set(0)
	m.gaveUp.WithLabelValues(name)
}

func (m *resumerMetrics) observe(name string, reqs []request) {
	var oldest float64
	var pending, permanent int
	for _, q := range reqs {
		oldest = max(oldest, q.ageSeconds)
		if q.permanent {
			permanent++
		} else {
			pending++
		}
	}
	m.oldest.WithLabelValues(name).Set(oldest)
	m.incomplete.WithLabelValues(name, "pending").Set(float64(pending))
	m.incomplete.WithLabelValues(name, "permanent").Set(float64(permanent))
}
