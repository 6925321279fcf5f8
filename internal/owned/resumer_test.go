package owned_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// The resumer on real Postgres: of three incomplete runs its kind lists,
// one keeps failing for a transient cause (tried MaxAttempts times, backing
// off, then permanent), one fails for a permanent cause (tried once, then
// permanent), one completes (its request goes). The permanent ones page:
// coordinator_incomplete_runs{state="permanent"} and the gave-up counter.
func TestResumerBoundsAttemptsAndPagesPermanentFailures(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	ctx := context.Background()
	var mu sync.Mutex
	incomplete := map[int]bool{1: true, 2: true, 3: true}
	w := &ownedtest.Widget{
		Incomplete: func(context.Context) ([]owned.Incomplete[ownedtest.Params], error) {
			mu.Lock()
			defer mu.Unlock()
			var out []owned.Incomplete[ownedtest.Params]
			for n := range incomplete {
				out = append(out, owned.Incomplete[ownedtest.Params]{Params: ownedtest.Params{N: n}, Since: time.Now().Add(-time.Hour), State: "RUNNING",
					Trigger: job.Trigger{Source: job.SourceHTTP, RequestID: "req-widget"}})
			}
			return out, nil
		},
		Work: func(_ context.Context, _ *owned.Run, n int) (owned.Report, error) {
			switch n {
			case 1:
				return owned.Report{}, owned.Retryable(errors.New("connection reset by peer"))
			case 2:
				return owned.Report{}, errors.New("the widget's data is wrong")
			}
			mu.Lock()
			delete(incomplete, n)
			mu.Unlock()
			return owned.Report{}, nil
		},
	}
	reg, err := owned.NewRegistry(w.Kind())
	require.NoError(t, err)
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a", WaitTime: 50 * time.Millisecond, WatchdogTimeout: 3 * time.Second})
	defer l.Close()
	rec := &events.Recorder{}
	runner, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: pg.Pool, Locker: l}, Replica: "replica-a", Emit: rec})
	require.NoError(t, err)
	prom := prometheus.NewRegistry()
	rs, err := owned.NewResumer(owned.ResumerConfig{Runner: runner, Interval: 20 * time.Millisecond, MaxAttempts: 3,
		Locks: l, Registerer: prom})
	require.NoError(t, err)
	require.Equal(t, []string{"widget"}, rs.Kinds())
	require.NoError(t, rs.Start(ctx))
	defer rs.Stop()

	type row struct {
		permanent bool
		attempts  int
		outcome   string
	}
	rows := func(c *assert.CollectT) map[string]row {
		out := map[string]row{}
		rs, err := pg.Pool.Query(ctx, `select run_key, permanent, attempts, coalesce(last_outcome, '') from run_requests where job = 'widget'`)
		require.NoError(c, err)
		defer rs.Close()
		for rs.Next() {
			var k string
			var r row
			require.NoError(c, rs.Scan(&k, &r.permanent, &r.attempts, &r.outcome))
			out[k] = r
		}
		return out
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got := rows(c)
		require.Equal(c, map[string]row{
			"widget:1": {permanent: true, attempts: 3, outcome: "failed"},
			"widget:2": {permanent: true, attempts: 0, outcome: "failed"},
		}, got)
		require.Equal(c, 2.0, testutil.ToFloat64(mustVec(prom, "coordinator_incomplete_runs", "permanent")))
	}, 30*time.Second, 20*time.Millisecond)
	rs.Stop()

	var ran1 int
	for _, e := range rec.OfType(events.RunFailed) {
		if e.Key == "widget:1" {
			ran1++
			require.Equal(t, true, e.Extra["retryable"])
			require.Equal(t, string(job.SourceResume), e.Trigger)
			require.Equal(t, "req-widget", e.RequestID, "the request's id")
		}
		if e.Key == "widget:2" {
			require.Equal(t, false, e.Extra["retryable"])
		}
	}
	require.Equal(t, 3, ran1, "the transient failure was tried MaxAttempts times, no more")
	require.Len(t, rec.OfType(events.RunCompleted), 1, "widget:3 completed once and its request went")
	require.Equal(t, 0.0, testutil.ToFloat64(mustVec(prom, "coordinator_incomplete_runs", "pending")))
	require.GreaterOrEqual(t, testutil.ToFloat64(mustVec(prom, "coordinator_incomplete_run_oldest_age_seconds", "")), 3600.0)
	require.Equal(t, 2.0, testutil.ToFloat64(mustVec(prom, "coordinator_resume_gave_up_total", "")))
}

// mustVec finds one series of a metric the resumer exports for job
// "widget" (and the given state, when not empty).
func mustVec(reg *prometheus.Registry, name, state string) prometheus.Collector {
	return collectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, err := reg.Gather()
		if err != nil {
			return
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, lp := range m.GetLabel() {
					labels[lp.GetName()] = lp.GetValue()
				}
				if labels["job"] != "widget" || (state != "" && labels["state"] != state) {
					continue
				}
				v := m.GetGauge().GetValue()
				if m.GetCounter() != nil {
					v = m.GetCounter().GetValue()
				}
				ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, "", nil, nil), prometheus.GaugeValue, v)
			}
		}
	})
}

type collectorFunc func(chan<- prometheus.Metric)

func (f collectorFunc) Describe(chan<- *prometheus.Desc)    {}
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) { f(ch) }

// An attempt that runs longer than one statement's bound (5 s) is still
// booked: its bound starts when the run ends.
func TestResumerBooksALongAttempt(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	ctx := context.Background()
	ran := make(chan struct{}, 10)
	w := &ownedtest.Widget{
		Incomplete: func(context.Context) ([]owned.Incomplete[ownedtest.Params], error) {
			return []owned.Incomplete[ownedtest.Params]{{Params: ownedtest.Params{N: 1}, State: "INTERRUPTED"}}, nil
		},
		Work: func(context.Context, *owned.Run, int) (owned.Report, error) {
			time.Sleep(6 * time.Second) // longer than the booking bound: the behaviour under test
			ran <- struct{}{}
			return owned.Report{}, owned.Retryable(errors.New("connection reset by peer"))
		},
	}
	reg, err := owned.NewRegistry(w.Kind())
	require.NoError(t, err)
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a", WaitTime: 50 * time.Millisecond, WatchdogTimeout: 3 * time.Second})
	defer l.Close()
	runner, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: pg.Pool, Locker: l}, Replica: "replica-a"})
	require.NoError(t, err)
	// A long interval: the first scan makes the only attempt of this test.
	rs, err := owned.NewResumer(owned.ResumerConfig{Runner: runner, Interval: time.Hour, MaxAttempts: 3})
	require.NoError(t, err)
	require.NoError(t, rs.Start(ctx))
	defer rs.Stop()
	select {
	case <-ran:
	case <-time.After(60 * time.Second):
		t.Fatal("the attempt did not run")
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var attempts int
		var outcome string
		require.NoError(c, pg.Pool.QueryRow(ctx, `select attempts, coalesce(last_outcome, '') from run_requests where run_key = 'widget:1'`).Scan(&attempts, &outcome))
		require.Equal(c, 1, attempts)
		require.Equal(c, "failed", outcome)
	}, 10*time.Second, 20*time.Millisecond)
}

// A run whose owner died holding its lock is resumed once the lock's TTL
// ends, not at the next Interval: the scan that finds the lock held looks
// again at the end of its TTL as listed (ownership.Inspector). Here the
// Interval is an hour, so only that rescan can resume the run; before, the
// run waited for the next Interval (15 s by default, on top of the TTL).
func TestResumerLooksAgainWhenAHeldLockExpires(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	ctx := context.Background()
	locker := func(owner string) *redislock.Locker {
		client, err := redislock.NewClient(rd.URL, "single")
		require.NoError(t, err)
		l, err := redislock.New(client, redislock.Config{Prefix: rd.Prefix, Owner: owner, WaitTime: 50 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(); _ = client.Close() })
		return l
	}
	// The dead owner's lock: an explicit lease nobody renews or releases.
	_, err := locker("replica-dead").Acquire(ctx, "widget:1", 1500*time.Millisecond)
	require.NoError(t, err)

	w := &ownedtest.Widget{Incomplete: func(context.Context) ([]owned.Incomplete[ownedtest.Params], error) {
		return []owned.Incomplete[ownedtest.Params]{{Params: ownedtest.Params{N: 1}, State: "RUNNING",
			Trigger: job.Trigger{Source: job.SourceHTTP, RequestID: "req-dead"}}}, nil
	}}
	reg, err := owned.NewRegistry(w.Kind())
	require.NoError(t, err)
	l := locker("replica-b")
	rec := &events.Recorder{}
	runner, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: pg.Pool, Locker: l}, Replica: "replica-b", Emit: rec})
	require.NoError(t, err)
	rs, err := owned.NewResumer(owned.ResumerConfig{Runner: runner, Interval: time.Hour, Locks: l})
	require.NoError(t, err)
	require.NoError(t, rs.Start(ctx))
	defer rs.Stop()

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.Len(c, rec.OfType(events.RunCompleted), 1, "resumed once the dead owner's lock expired")
	}, 30*time.Second, 10*time.Millisecond)
	done := rec.OfType(events.RunCompleted)[0]
	require.Equal(t, "widget:1", done.Key)
	require.Equal(t, string(job.SourceResume), done.Trigger)
	require.Equal(t, "req-dead", done.RequestID)
	require.Empty(t, rec.OfType(events.OwnershipAlreadyOwned), "no attempt while the lock was held")
}

// A replica whose resumer is running one long resumed run still resumes
// another run whose owner died: attempts run in goroutines of their own
// (Concurrency), so the scan, and the look at a held lock's TTL end, go on.
// Before, the scan waited for the long run to end.
func TestResumerBusyWithALongRunStillResumesADeadOwnersRun(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	ctx := context.Background()
	locker := func(owner string) *redislock.Locker {
		client, err := redislock.NewClient(rd.URL, "single")
		require.NoError(t, err)
		l, err := redislock.New(client, redislock.Config{Prefix: rd.Prefix, Owner: owner, WaitTime: 50 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(); _ = client.Close() })
		return l
	}
	_, err := locker("replica-dead").Acquire(ctx, "widget:2", 1500*time.Millisecond)
	require.NoError(t, err)

	long := make(chan struct{})
	w := &ownedtest.Widget{
		Incomplete: func(context.Context) ([]owned.Incomplete[ownedtest.Params], error) {
			return []owned.Incomplete[ownedtest.Params]{
				{Params: ownedtest.Params{N: 1}, State: "INTERRUPTED", Trigger: job.Trigger{Source: job.SourceKafka, RequestID: "req-long"}},
				{Params: ownedtest.Params{N: 2}, State: "RUNNING", Trigger: job.Trigger{Source: job.SourceHTTP, RequestID: "req-dead"}},
			}, nil
		},
		Work: func(ctx context.Context, _ *owned.Run, n int) (owned.Report, error) {
			if n == 1 {
				select { // the long run: until the test ends
				case <-long:
				case <-ctx.Done():
				}
			}
			return owned.Report{}, nil
		},
	}
	reg, err := owned.NewRegistry(w.Kind())
	require.NoError(t, err)
	l := locker("replica-b")
	rec := &events.Recorder{}
	runner, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: pg.Pool, Locker: l}, Replica: "replica-b", Emit: rec})
	require.NoError(t, err)
	rs, err := owned.NewResumer(owned.ResumerConfig{Runner: runner, Interval: time.Hour, Locks: l})
	require.NoError(t, err)
	require.NoError(t, rs.Start(ctx))
	defer rs.Stop()
	defer close(long)

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		done := rec.OfType(events.RunCompleted)
		require.Len(c, done, 1)
		require.Equal(c, "widget:2", done[0].Key, "the dead owner's run, resumed while widget:1 runs")
	}, 30*time.Second, 10*time.Millisecond)
	acquired := map[string]bool{}
	for _, e := range rec.OfType(events.OwnershipAcquired) {
		acquired[e.Key] = true
	}
	require.True(t, acquired["widget:1"], "the long run is in flight")
}
