package billrun

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/telco-platform/coordinator/internal/job"
)

// Metrics are the bill run's Prometheus series (prefix coordinator_billrun_).
// A nil *Metrics is valid and records nothing.
type Metrics struct {
	runs        *prometheus.CounterVec
	batches     *prometheus.CounterVec
	phase       *prometheus.HistogramVec
	invoices    prometheus.Counter
	already     prometheus.Counter
	conflicts   prometheus.Counter
	runningRuns prometheus.Gauge
	lateUsage   *prometheus.GaugeVec
	lateChecks  *prometheus.CounterVec
	adjustments prometheus.Counter
	// The completion's reconcile (complete.go). Unlabelled counters: they
	// exist at 0 from registration, so an alert's increase() sees the
	// first one after a start.
	repairedSubs   prometheus.Counter
	unreconciled   prometheus.Counter
	emptyPops      prometheus.Counter
	reconcileTime  prometheus.Histogram
	adjustInvoices prometheus.Counter
}

// Batch phases timed by coordinator_billrun_batch_phase_seconds.
const (
	// PhaseAcquire is waiting for a pool connection.
	PhaseAcquire = "acquire"
	// PhaseVerify is a retry's look for its batch committed unseen.
	PhaseVerify = "verify"
	// PhaseStatement is the batch's one round trip: fence check, invoices,
	// batch record and the implicit commit.
	PhaseStatement = "statement"
)

// NewMetrics creates the series and registers them on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinator_billrun_runs_total",
			Help: "Bill runs by outcome (completed, already_completed, already_owned, unavailable, lost, failed).",
		}, []string{"outcome"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinator_billrun_batches_total",
			Help: "Batch transactions by result (committed, retried, fence_lost, failed, skipped).",
		}, []string{"result"}),
		phase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "coordinator_billrun_batch_phase_seconds",
			Help:    "Time spent in each phase of a batch (acquire: a pool connection; verify: a retry's look for its batch committed unseen; statement: the one round trip that checks the fence, inserts the invoices, records the batch and commits).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12),
		}, []string{"phase"}),
		invoices: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordinator_billrun_invoices_created_total",
			Help: "Invoices inserted by bill runs.",
		}),
		already: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordinator_billrun_already_invoiced_total",
			Help: "Subscribers found already invoiced for the period (ON CONFLICT DO NOTHING).",
		}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordinator_billrun_unique_violations_total",
			Help: "Unique violations (SQLSTATE 23505) that escaped ON CONFLICT in a batch.",
		}),
		runningRuns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "coordinator_billrun_running",
			Help: "Bill runs this replica is executing now.",
		}),
		lateUsage: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "coordinator_billrun_late_usage_subscribers",
			Help: "Subscribers of a COMPLETED period with usage no invoice or adjustment covers, as last checked (a trigger answered already_completed, or an adjustment run ended).",
		}, []string{"period"}),
		lateChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinator_billrun_late_checks_total",
			Help: "Late-usage checks of COMPLETED periods, by how they were answered: kept (the subscribers late at the period's last check and those changed since, by index) or full (every invoice of the period).",
		}, []string{"how"}),
		adjustments: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordinator_billrun_adjustments_created_total",
			Help: "Invoice adjustments inserted by adjustment runs (late usage).",
		}),
		repairedSubs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordinator_billrun_repaired_subscribers_total",
			Help: "Subscribers a bill run's completion found without an invoice after all its batches had committed (lost commits, rows changed behind the run), and billed under its fence before it was COMPLETED.",
		}),
		unreconciled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordinator_billrun_reconcile_failures_total",
			Help: "Bill runs whose batches were all done but whose period's invoices could not be made its population: not COMPLETED, FAILED and retried by the resumer.",
		}),
		emptyPops: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordinator_billrun_empty_populations_total",
			Help: "Bill runs COMPLETED with no billable subscriber at the cutoff (run.completed empty_population: true).",
		}),
		reconcileTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "coordinator_billrun_reconcile_seconds",
			Help:    "Time a bill run's completion spent reconciling the period's invoices with its population (and repairing a gap).",
			Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 10),
		}),
		adjustInvoices: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordinator_billrun_adjustment_invoices_created_total",
			Help: "Invoices adjustment runs inserted for subscribers of a COMPLETED period that had none (loaded or backdated into it after its bill run).",
		}),
	}
	// Every outcome at 0 from the start: an alert's increase() sees the
	// first failure after a replica starts (a counter first seen at 1 has
	// no increase).
	for _, o := range []job.Outcome{job.OutcomeCompleted, job.OutcomeAlreadyCompleted, job.OutcomeAlreadyOwned,
		job.OutcomeUnavailable, job.OutcomeLost, job.OutcomeFailed} {
		m.runs.WithLabelValues(string(o))
	}
	for _, how := range []string{lateHowKept, lateHowFull} {
		m.lateChecks.WithLabelValues(how) // both series from the start
	}
	if reg != nil {
		reg.MustRegister(m.runs, m.batches, m.phase, m.invoices, m.already, m.conflicts, m.runningRuns, m.lateUsage, m.lateChecks, m.adjustments,
			m.repairedSubs, m.unreconciled, m.emptyPops, m.reconcileTime, m.adjustInvoices)
	}
	return m
}

func (m *Metrics) outcome(o job.Outcome) {
	if m != nil {
		m.runs.WithLabelValues(string(o)).Inc()
	}
}

func (m *Metrics) batch(result string, n int) {
	if m != nil && n > 0 {
		m.batches.WithLabelValues(result).Add(float64(n))
	}
}

func (m *Metrics) observePhase(phase string, d time.Duration) {
	if m != nil {
		m.phase.WithLabelValues(phase).Observe(d.Seconds())
	}
}

func (m *Metrics) committed(created, already int64) {
	if m != nil {
		m.batches.WithLabelValues("committed").Inc()
		m.invoices.Add(float64(created))
		m.already.Add(float64(already))
	}
}

func (m *Metrics) uniqueViolation() {
	if m != nil {
		m.conflicts.Inc()
	}
}

func (m *Metrics) running(delta float64) {
	if m != nil {
		m.runningRuns.Add(delta)
	}
}

func (m *Metrics) lateUsageChecked(p Period, subscribers int64, how string) {
	if m != nil {
		m.lateUsage.WithLabelValues(p.String()).Set(float64(subscribers))
		m.lateChecks.WithLabelValues(how).Inc()
	}
}

func (m *Metrics) adjusted(n int64) {
	if m != nil {
		m.adjustments.Add(float64(n))
	}
}

func (m *Metrics) repaired(n int64) {
	if m != nil && n > 0 {
		m.repairedSubs.Add(float64(n))
		m.invoices.Add(float64(n))
	}
}

func (m *Metrics) reconcileFailed() {
	if m != nil {
		m.unreconciled.Inc()
	}
}

func (m *Metrics) emptyPopulation() {
	if m != nil {
		m.emptyPops.Inc()
	}
}

func (m *Metrics) observeReconcile(d time.Duration) {
	if m != nil {
		m.reconcileTime.Observe(d.Seconds())
	}
}

func (m *Metrics) adjustmentInvoices(n int64) {
	if m != nil && n > 0 {
		m.adjustInvoices.Add(float64(n))
	}
}
