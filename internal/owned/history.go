package owned

import (
	"maps"
	"sync"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
)

// RunHistory keeps one record per run that held its lock (the console's run
// history). The template calls RunEnded once per such run, at its outcome,
// on the run's goroutine: an implementation must not block (buffer, and
// drop and count when full). Runs that never held the lock (already_owned,
// unavailable) are not runs: their events say what happened.
type RunHistory interface {
	RunEnded(rec RunRecord)
}

// RunRecord is one run as the template saw it end.
type RunRecord struct {
	Job, Key string
	Outcome  job.Outcome
	// Replica is the owner: the replica that held the lock.
	Replica string
	// Fence is the claim's fence (Claimer), else the lock's; LockFence the
	// lock's.
	Fence, LockFence int64
	Trigger          job.Trigger
	// Started is when the lock was taken; Ended when the outcome was fixed.
	Started, Ended time.Time
	// Counts are the kind's Report counts (a bill run's invoices_created,
	// repaired, ...).
	Counts map[string]int64
	// Error is the failure or loss, empty when completed.
	Error string
	// Timeline is the run's progress over time (batches committed, earlier
	// runs' included, and rows), at most maxTimeline points.
	Timeline []ProgressPoint
}

// ProgressPoint is the progress of a run At after its work began.
type ProgressPoint struct {
	At      time.Duration
	Batches int64
	Rows    int64
}

// maxTimeline bounds a run's timeline: when full, every other point goes
// and the spacing doubles, so a run of any length keeps its whole shape.
const (
	maxTimeline      = 240
	timelineFirstGap = 250 * time.Millisecond
)

// timeline samples a run's progress as its batches commit.
type timeline struct {
	mu     sync.Mutex
	gap    time.Duration
	points []ProgressPoint
}

// add records the progress at at: a point when the last one is at least
// the spacing old, else the last point moves up to this one.
func (t *timeline) add(p ProgressPoint) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gap == 0 {
		t.gap = timelineFirstGap
	}
	n := len(t.points)
	if n > 1 && p.At-t.points[n-2].At < t.gap {
		t.points[n-1] = p
		return
	}
	t.points = append(t.points, p)
	if len(t.points) >= maxTimeline {
		kept := t.points[:0]
		for i, q := range t.points {
			if i%2 == 0 || i == len(t.points)-1 {
				kept = append(kept, q)
			}
		}
		t.points = kept
		t.gap *= 2
	}
}

func (t *timeline) snapshot() []ProgressPoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]ProgressPoint(nil), t.points...)
}

// recordHistory hands a run that held its lock to the RunHistory.
func (o *Owned) recordHistory() {
	h := o.r.history
	if h == nil || o.held == nil {
		return
	}
	run := o.run
	rec := RunRecord{
		Job: run.job, Key: run.key, Outcome: o.res.Outcome, Replica: o.r.replica,
		Fence: run.fence, LockFence: run.lockFence, Trigger: run.trigger,
		Started: run.acquired, Ended: time.Now(), Counts: maps.Clone(o.res.Counts), Error: o.res.Error,
		Timeline: run.prog.timeline.snapshot(),
	}
	h.RunEnded(rec)
}
