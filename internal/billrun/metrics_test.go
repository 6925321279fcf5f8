package billrun_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
)

func TestMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seeded := b.seed(t, billrun.SeedConfig{Subscribers: 120, SuspendedRatio: 0.2})
	reg := prometheus.NewRegistry()
	r := b.runner(billrun.Config{Metrics: billrun.NewMetrics(reg), BatchSize: 50})
	require.Equal(t, job.OutcomeCompleted, r.Run(context.Background(), period, trig()).Outcome)
	require.Equal(t, job.OutcomeAlreadyCompleted, r.Run(context.Background(), period, trig()).Outcome)

	require.Equal(t, 1.0, value(t, reg, "coordinator_billrun_runs_total", "completed"))
	require.Equal(t, 1.0, value(t, reg, "coordinator_billrun_runs_total", "already_completed"))
	require.Equal(t, float64((seeded.Active+49)/50), value(t, reg, "coordinator_billrun_batches_total", "committed"))
	require.Equal(t, float64(seeded.Active), value(t, reg, "coordinator_billrun_invoices_created_total", ""))
	require.Equal(t, 0.0, value(t, reg, "coordinator_billrun_running", ""))
	require.Equal(t, float64((seeded.Active+49)/50), value(t, reg, "coordinator_billrun_batch_phase_seconds", billrun.PhaseStatement))

	// A nil *Metrics records nothing and does not panic; unregistered ones are fine.
	require.Equal(t, job.OutcomeAlreadyCompleted, b.runner(billrun.Config{}).Run(context.Background(), period, trig()).Outcome)
	require.Equal(t, job.OutcomeAlreadyCompleted, b.runner(billrun.Config{Metrics: billrun.NewMetrics(nil)}).Run(context.Background(), period, trig()).Outcome)
}

// value returns a counter's or gauge's value, or a histogram's sample count,
// for the series whose one label (if any) has the value label.
func value(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) > 0 && m.GetLabel()[0].GetValue() != label {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no series %s{%s}", name, label)
	return 0
}
