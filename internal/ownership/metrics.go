package ownership

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Acquisition outcomes counted by Metrics.
const (
	OutcomeAcquired     = "acquired"
	OutcomeReentered    = "reentered"
	OutcomeAlreadyOwned = "already_owned"
	OutcomeUnavailable  = "unavailable"
	OutcomeCanceled     = "canceled"
)

// Renewal outcomes counted by Metrics.
const (
	RenewalOK    = "ok"
	RenewalGone  = "gone"  // the lock was no longer ours: the lease is lost
	RenewalError = "error" // Redis could not be reached; retried until the trust deadline
)

// Metrics are the coordinator_lock_* Prometheus series every Locker reports.
// A nil *Metrics is valid and records nothing.
type Metrics struct {
	acquisitions *prometheus.CounterVec
	acquireWait  prometheus.Histogram
	hold         prometheus.Histogram
	renewals     *prometheus.CounterVec
	lost         prometheus.Counter
	held         prometheus.Gauge
}

// NewMetrics builds the lock metrics and registers them on reg (nil: not
// registered). Registering twice on one registry reuses the series already
// there, so several Lockers in one process can share a registry.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinator_lock_acquisitions_total",
			Help: "Lock acquisitions by outcome (acquired, reentered, already_owned, unavailable, canceled).",
		}, []string{"outcome"}),
		acquireWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "coordinator_lock_acquire_wait_seconds",
			Help:    "Time spent in Acquire, waiting included, whatever the outcome.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		hold: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "coordinator_lock_hold_seconds",
			Help:    "How long a lease was held, from acquisition to release or loss.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 12),
		}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordinator_lock_renewals_total",
			Help: "Watchdog lease renewals by outcome (ok, gone, error).",
		}, []string{"outcome"}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordinator_lock_leases_lost_total",
			Help: "Leases that ended without their holder releasing them.",
		}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "coordinator_lock_leases_held",
			Help: "Leases currently held by this process.",
		}),
	}
	if reg != nil {
		m.acquisitions = register(reg, m.acquisitions)
		m.acquireWait = register(reg, m.acquireWait)
		m.hold = register(reg, m.hold)
		m.renewals = register(reg, m.renewals)
		m.lost = register(reg, m.lost)
		m.held = register(reg, m.held)
	}
	// Every outcome at 0 from the start: an alert's rate() or increase()
	// sees the first unavailable acquisition or failed renewal after a
	// replica starts (a counter first seen at 1 has no increase).
	for _, o := range []string{OutcomeAcquired, OutcomeReentered, OutcomeAlreadyOwned, OutcomeUnavailable, OutcomeCanceled} {
		m.acquisitions.WithLabelValues(o)
	}
	for _, o := range []string{RenewalOK, RenewalGone, RenewalError} {
		m.renewals.WithLabelValues(o)
	}
	return m
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(err) // a programming error: a different collector under our name
	}
	return c
}

// Acquire records one Acquire call.
func (m *Metrics) Acquire(outcome string, wait time.Duration) {
	if m == nil {
		return
	}
	m.acquisitions.WithLabelValues(outcome).Inc()
	m.acquireWait.Observe(wait.Seconds())
}

// Held records a new lease (not a reentrant hold).
func (m *Metrics) Held() {
	if m == nil {
		return
	}
	m.held.Inc()
}

// Ended records the end of a lease held for d; lost says it was not released.
func (m *Metrics) Ended(d time.Duration, lost bool) {
	if m == nil {
		return
	}
	m.held.Dec()
	m.hold.Observe(d.Seconds())
	if lost {
		m.lost.Inc()
	}
}

// Renewals records n renewals with one outcome.
func (m *Metrics) Renewals(outcome string, n int) {
	if m == nil || n == 0 {
		return
	}
	m.renewals.WithLabelValues(outcome).Add(float64(n))
}

// AcquireOutcome maps an Acquire error to its outcome label.
func AcquireOutcome(err error) string {
	var ae *AcquireError
	switch {
	case err == nil:
		return OutcomeAcquired
	case errors.As(err, &ae) && (errors.Is(ae.Err, context.Canceled) || errors.Is(ae.Err, context.DeadlineExceeded)):
		return OutcomeCanceled
	case errors.Is(err, ErrAlreadyOwned):
		return OutcomeAlreadyOwned
	default:
		return OutcomeUnavailable
	}
}

// LeasesHeldGauge exposes the leases-held gauge (tests, readiness pages).
func (m *Metrics) LeasesHeldGauge() prometheus.Gauge { return m.held }

// RenewalsCounter exposes the renewals counter of one outcome.
func (m *Metrics) RenewalsCounter(outcome string) prometheus.Counter {
	return m.renewals.WithLabelValues(outcome)
}
