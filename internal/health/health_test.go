package health_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/health"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitRounds waits until the monitor completed n rounds.
func waitRounds(t *testing.T, m *health.Monitor, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		got, next := m.Rounds()
		if got >= n {
			return
		}
		select {
		case <-next:
		case <-deadline:
			t.Fatalf("only %d of %d rounds within 10s", got, n)
		}
	}
}

// Checks run on the interval, not per read: reading the snapshot a thousand
// times costs no check at all.
func TestChecksRunInTheBackgroundNotPerRead(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	m, err := health.New(health.Config{Interval: time.Hour, Checks: []health.Check{{Name: "postgres", Check: func(context.Context) error {
		calls.Add(1)
		return nil
	}}}})
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	defer m.Stop()
	n, _ := m.Rounds()
	require.Equal(t, 1, n, "Start ran the first round")
	waitRounds(t, m, 1)
	for range 1000 {
		s := m.Snapshot()
		require.True(t, s[0].OK)
	}
	require.EqualValues(t, 1, calls.Load(), "one round at start, the next after an hour")
	require.Error(t, m.Start(context.Background()), "started twice")
}

func TestTransitionsMetricsAndTimeouts(t *testing.T) {
	t.Parallel()
	var redisDown atomic.Bool
	logs := &testenv.Buffer{}
	reg := prometheus.NewRegistry()
	m, err := health.New(health.Config{
		Timeout:    200 * time.Millisecond,
		Log:        slog.New(slog.NewJSONHandler(logs, nil)),
		Registerer: reg,
		Checks: []health.Check{
			{Name: "redis", Check: func(context.Context) error {
				if redisDown.Load() {
					return errors.New("dial tcp 127.0.0.1:6379: connection refused")
				}
				return nil
			}},
			{Name: "kafka", Check: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }},
			{Name: "panicky", Check: func(context.Context) error { panic("boom") }},
		},
	})
	require.NoError(t, err)
	before := m.Snapshot()
	require.Len(t, before, 3)
	require.False(t, before[0].Checked, "not checked before the first round")

	ctx := context.Background()
	m.Round(ctx)
	s := m.Snapshot()
	require.True(t, s[0].OK)
	require.False(t, s[1].OK)
	require.Contains(t, s[1].Error, "no answer within the check timeout")
	require.Equal(t, "check panicked: boom", s[2].Error)
	require.Equal(t, 1.0, upValue(t, reg, "redis"))
	require.Equal(t, 0.0, upValue(t, reg, "kafka"))
	require.Contains(t, logs.String(), `"msg":"dependency_down","dependency":"kafka"`)
	require.NotContains(t, logs.String(), `"dependency_up"`, "a first good check is no recovery")

	redisDown.Store(true)
	m.Round(ctx)
	s = m.Snapshot()
	require.False(t, s[0].OK)
	require.Equal(t, "dial tcp 127.0.0.1:6379: connection refused", s[0].Error)
	require.Equal(t, s[0].CheckedAt, s[0].Since, "down since this check")
	downSince := s[0].Since
	require.Equal(t, 0.0, upValue(t, reg, "redis"))
	m.Round(ctx)
	require.Equal(t, downSince, m.Snapshot()[0].Since, "still down since the first failing check")
	require.Equal(t, 1, strings.Count(logs.String(), `"msg":"dependency_down","dependency":"redis"`), "logged once, on the transition")

	redisDown.Store(false)
	m.Round(ctx)
	require.True(t, m.Snapshot()[0].OK)
	require.Contains(t, logs.String(), `"msg":"dependency_up","dependency":"redis"`)
	require.Equal(t, 1.0, upValue(t, reg, "redis"))
	require.Equal(t, 3, testutil.CollectAndCount(reg, "coordinator_dependency_check_duration_seconds"), "one series per dependency")
	m.Stop()
	m.Stop()
}

func upValue(t *testing.T, reg *prometheus.Registry, dep string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "coordinator_dependency_up" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == dep {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no coordinator_dependency_up{dependency=%q}", dep)
	return 0
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	ok := func(context.Context) error { return nil }
	_, err := health.New(health.Config{Checks: []health.Check{{Name: "x", Check: ok}, {Name: "x", Check: ok}}})
	require.ErrorContains(t, err, `"x"`)
	_, err = health.New(health.Config{Checks: []health.Check{{Name: "y"}}})
	require.ErrorContains(t, err, `"y"`)
}

func TestLoopRunsOnTheInterval(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	m, err := health.New(health.Config{Interval: 20 * time.Millisecond, Checks: []health.Check{{Name: "redis", Check: func(context.Context) error {
		calls.Add(1)
		return nil
	}}}})
	require.NoError(t, err)
	require.NoError(t, m.Start(context.Background()))
	waitRounds(t, m, 4)
	m.Stop()
	n, _ := m.Rounds()
	require.EqualValues(t, n, calls.Load())
}
