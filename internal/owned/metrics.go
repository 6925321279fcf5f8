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

// outcomes are every job.Outcome, the label values of a run's series.
var outcomes = []job.Outcome{job.OutcomeCompleted, job.OutcomeAlreadyCompleted, job.OutcomeAlreadyOwned,
	job.OutcomeUnavailable, job.OutcomeLost, job.OutcomeFailed}

// newMetrics creates the template's series, each kind's (jobs) at 0 for
// every outcome: an alert's increase() over
// coordinator_run_duration_seconds_count then sees the first lost or failed
// run after a replica starts (a series first seen at 1 has no increase).
func newMetrics(reg prometheus.Registerer, runs *inFlight, jobs []string) (*metrics, error) {
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
	for _, name := range jobs {
		m.executing.WithLabelValues(name)
		for _, o := range outcomes {
			m.duration.WithLabelValues(name, string(o))
		}
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.duration, m.executing, newProgressCollector(runs)} {
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

// progressCollector exports the progress of the runs in flight at each
// scrape (coordinator_run_progress_*{job, key}); a run's series go when it
// ends. Nothing is recorded on the batches' path.
type progressCollector struct {
	runs                                   *inFlight
	committed, total, ratio, rowsRate, eta *prometheus.Desc
}

func newProgressCollector(runs *inFlight) *progressCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"job", "key"}, nil)
	}
	return &progressCollector{
		runs:      runs,
		committed: d("coordinator_run_progress_batches_committed", "Batches committed of the run in flight, those of earlier runs of the same work (resume) included."),
		total:     d("coordinator_run_progress_batches_total", "Batches of the run in flight in all, as its kind counts them (0 while not known)."),
		ratio:     d("coordinator_run_progress_ratio", "Share of the run in flight that is done (0-1); absent while its total is not known."),
		rowsRate:  d("coordinator_run_progress_rows_per_second", "Rows per second the run in flight has committed since it began."),
		eta:       d("coordinator_run_progress_eta_seconds", "Estimated seconds left of the run in flight, at its rate so far; absent while not known."),
	}
}

func (c *progressCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.committed, c.total, c.ratio, c.rowsRate, c.eta} {
		ch <- d
	}
}

func (c *progressCollector) Collect(ch chan<- prometheus.Metric) {
	seen := map[string]bool{}
	for _, p := range c.runs.snapshot() {
		if seen[p.Key] {
			continue
		}
		seen[p.Key] = true
		g := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, p.Job, p.Key)
		}
		g(c.committed, float64(p.BatchesCommitted))
		g(c.total, float64(p.BatchesTotal))
		g(c.rowsRate, p.RowsPerSecond)
		if p.Known() {
			g(c.ratio, p.Percent/100)
		}
		if p.ETA >= 0 {
			g(c.eta, p.ETA.Seconds())
		}
	}
}
