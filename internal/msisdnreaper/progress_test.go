package msisdnreaper

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/telemetry"
	"github.com/telco-platform/coordinator/internal/testenv"
)

type lastProgress struct {
	mu   sync.Mutex
	seen []owned.Progress
}

func (l *lastProgress) Track(run *owned.Run) func() {
	return func() {
		l.mu.Lock()
		l.seen = append(l.seen, run.Progress())
		l.mu.Unlock()
	}
}

// The sweep reports its progress through the template like every kind: a
// total from the stale reservations it starts with, a batch per freeing
// statement, a msisdn-reaper.batch span each.
func TestSweepReportsProgressAndSpans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	_, err := Seed(ctx, pg.Pool, SeedSpec{Free: 10, StaleReserved: 2500, ValidReserved: 5})
	require.NoError(t, err)
	prog := &lastProgress{}
	sr := tracetest.NewSpanRecorder()
	k := NewSweepKind(Config{BatchSize: 1000, Workers: 1})
	reg, err := owned.NewRegistry(k)
	require.NoError(t, err)
	l := memLocker(t, "replica-a", time.Second)
	r, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: pg.Pool, Locker: l}, Replica: "replica-a",
		Progress: prog, Tracer: telemetry.NewForTest(sr, nil).TracerIfOn(owned.TracerName), Emit: &events.Recorder{}})
	require.NoError(t, err)
	res := r.Run(ctx, k, sweep(k), cliTrigger)
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)

	require.Len(t, prog.seen, 1)
	p := prog.seen[0]
	require.Equal(t, "msisdn-reaper", p.Job)
	require.Equal(t, int64(3), p.BatchesTotal, "2500 stale in batches of 1000")
	require.Equal(t, int64(3), p.BatchesCommitted)
	require.Equal(t, int64(2500), p.Rows)
	require.Equal(t, 100.0, p.Percent)
	var batches int
	for _, s := range sr.Ended() {
		if s.Name() == "msisdn-reaper.batch" {
			batches++
		}
	}
	require.Equal(t, 3, batches)
}
