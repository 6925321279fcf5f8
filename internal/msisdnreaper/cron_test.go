package msisdnreaper_test

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/trigger"
)

// This file is an external test package: trigger imports msisdnreaper.

type timedEvents struct {
	mu     sync.Mutex
	evs    []events.Event
	starts []time.Time // when each sweep that completed was called
}

func (s *timedEvents) sweepStarted(at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.starts = append(s.starts, at)
}

func (s *timedEvents) Emit(_ context.Context, e events.Event) {
	e.Time = time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evs = append(s.evs, e)
}

func (s *timedEvents) of(typ events.Type) []events.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []events.Event
	for _, e := range s.evs {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// Every replica runs the same cron (trigger.Cron, as `serve` wires it); the
// lock and the minimum hold make one of them sweep per tick.
func TestCronOnThreeReplicasSweepsOncePerTick(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	_, err := msisdnreaper.Seed(ctx, pg.Pool, msisdnreaper.SeedSpec{StaleReserved: 100, Free: 10})
	require.NoError(t, err)

	const minHold = 600 * time.Millisecond
	rec := &timedEvents{}
	var crons []*trigger.Cron
	for _, id := range []string{"replica-a", "replica-b", "replica-c"} {
		client, err := redislock.NewClient(rd.URL, "single")
		require.NoError(t, err)
		l, err := redislock.New(client, redislock.Config{Prefix: rd.Prefix, Owner: id, WaitTime: 100 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(); _ = client.Close() })
		s := msisdnreaper.NewTestSweeper(pg.Pool, l, rec,
			msisdnreaper.Config{Lease: 500 * time.Millisecond, MinHold: minHold})
		c, err := trigger.NewCron(trigger.CronConfig{Replica: id}, trigger.CronJob{Name: msisdnreaper.JobName, Spec: "@every 1s",
			Run: func(ctx context.Context, t job.Trigger, _ time.Time) error {
				called := time.Now()
				if s.Sweep(ctx, t).Outcome == job.OutcomeCompleted {
					rec.sweepStarted(called)
				}
				return nil
			}})
		require.NoError(t, err)
		require.NoError(t, c.Start(ctx))
		crons = append(crons, c)
	}
	require.Eventually(t, func() bool { return len(rec.of(events.RunCompleted)) >= 2 }, 10*time.Second, 10*time.Millisecond)
	for _, c := range crons {
		c.Stop()
		c.Stop() // safe twice
	}

	completed := rec.of(events.RunCompleted)
	var freed int64
	for _, e := range completed {
		require.Equal(t, string(job.SourceCron), e.Trigger)
		freed += e.Extra["freed"].(int64)
	}
	// Each acquisition is stamped after it happened, so after the previous
	// sweep's release, which is at least minHold after that sweep acquired,
	// which is after it was called.
	var acquired []time.Time
	for _, e := range rec.of(events.OwnershipAcquired) {
		acquired = append(acquired, e.Time)
	}
	rec.mu.Lock()
	called := append([]time.Time(nil), rec.starts...)
	rec.mu.Unlock()
	require.Len(t, acquired, len(completed))
	require.Len(t, called, len(completed))
	sort.Slice(acquired, func(i, j int) bool { return acquired[i].Before(acquired[j]) })
	sort.Slice(called, func(i, j int) bool { return called[i].Before(called[j]) })
	for i := 1; i < len(acquired); i++ {
		require.GreaterOrEqual(t, acquired[i].Sub(called[i-1]), minHold, "two sweeps in one interval")
	}
	require.Equal(t, int64(100), freed)
	require.NotEmpty(t, rec.of(events.OwnershipAlreadyOwned), "the other replicas were told who owns the tick")
}
