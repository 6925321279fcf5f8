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
	mu  sync.Mutex
	evs []events.Event
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
		c, err := trigger.NewCron(id, nil, trigger.CronJob{Name: msisdnreaper.JobName, Spec: "@every 1s",
			Run: func(ctx context.Context, t job.Trigger) { s.Sweep(ctx, t) }})
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
	var starts []time.Time
	for _, e := range completed {
		require.Equal(t, string(job.SourceCron), e.Trigger)
		freed += e.Extra["freed"].(int64)
	}
	for _, e := range rec.of(events.OwnershipAcquired) {
		starts = append(starts, e.Time)
	}
	require.Len(t, starts, len(completed))
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	for i := 1; i < len(starts); i++ {
		require.GreaterOrEqual(t, starts[i].Sub(starts[i-1]), minHold-50*time.Millisecond, "two sweeps in one interval")
	}
	require.Equal(t, int64(100), freed)
	require.NotEmpty(t, rec.of(events.OwnershipAlreadyOwned), "the other replicas were told who owns the tick")
}
