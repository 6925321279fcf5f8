package billrun

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// total keeps the run's progress denominator (owned.Run.SetTotal and
// bill_runs.batches_total): an estimate from sqlCountToPlan while the plan
// goes on (counted beside it, so the first batches do not wait for the
// count), then the exact number once the planner has walked the whole population.
type total struct {
	x       *execution
	skipped int64
	st      *runState

	mu         sync.Mutex
	done       bool // exact: the estimate no longer counts
	stopCount  context.CancelFunc
	countEnded chan struct{}
}

// startTotal counts in the background under wg.
func (x *execution) startTotal(ctx context.Context, wg *sync.WaitGroup, skipped int64, st *runState) *total {
	t := &total{x: x, skipped: skipped, st: st, countEnded: make(chan struct{})}
	cctx, stop := context.WithCancel(ctx)
	t.stopCount = stop
	wg.Go(func() {
		defer close(t.countEnded)
		defer stop()
		t.estimate(cctx)
	})
	return t
}

func (t *total) estimate(ctx context.Context) {
	x := t.x
	var left int64
	if err := x.pool.QueryRow(ctx, sqlCountToPlan, x.period.String(), x.cut.start, x.cut.end, x.cut.at, x.fence).Scan(&left); err != nil {
		if ctx.Err() == nil {
			x.log.Warn("billrun_count_failed", "error", err, "detail", "progress has no total until the plan is complete")
		}
		return
	}
	size := int64(x.cfg.BatchSize)
	n := t.skipped + (max(left, 0)+size-1)/size
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return
	}
	t.st.mu.Lock()
	n = max(n, t.skipped+t.st.planned) // never below what is already planned
	t.st.mu.Unlock()
	t.set(ctx, n)
}

// exact fixes the total once the plan is complete; a count still running
// is cancelled.
func (t *total) exact(ctx context.Context) {
	t.stopCount()
	<-t.countEnded
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done = true
	t.st.mu.Lock()
	n := t.skipped + t.st.planned
	t.st.mu.Unlock()
	t.set(ctx, n)
}

// set tells the template and stores the total under the fence (best
// effort: the status shows no total until a later write succeeds).
func (t *total) set(ctx context.Context, n int64) {
	x := t.x
	x.run.SetTotal(n)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := x.pool.Exec(wctx, sqlRecordTotal, x.period.String(), x.fence, n); err != nil && ctx.Err() == nil {
		x.log.Warn("billrun_record_total_failed", "error", err, "batches_total", n)
	}
}

// CountToPlan is the progress total's estimate (sqlCountToPlan) of a run of
// period p, with the period's instants start and end and the population's
// cutoff, under claim fence (0: no claim's batches are its own): the
// subscribers left to plan. Benchmarks and tests time and check the
// production statement through it.
func CountToPlan(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, p Period, start, end, cutoff time.Time, fence int64) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, sqlCountToPlan, p.String(), start, end, cutoff, fence).Scan(&n)
	return n, err
}
