package owned

import (
	"context"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
)

// DefaultProgressInterval is COORDINATOR_PROGRESS_INTERVAL's default.
const DefaultProgressInterval = 10 * time.Second

// progress is one run's progress as its kind reports it: atomics, so that
// a committed batch costs the kind two atomic adds, and readers (the
// reporter, the gauges, a status read) take snapshots whenever they like.
type progress struct {
	total     atomic.Int64 // batches in all, those of earlier runs included; 0 not known
	resumed   atomic.Int64 // batches committed by earlier runs (a resume)
	committed atomic.Int64 // batches this run committed
	rows      atomic.Int64 // rows this run committed
	began     atomic.Int64 // Execute's start, unix nanoseconds; 0 before

	timeline timeline // for the run's history record (RunHistory)
}

// SetTotal says how many batches the work has in all, those committed by
// earlier runs of the same work included; 0 means not known yet. Call it
// again as the count gets better (an estimate at the start, the exact
// number once the plan is complete).
func (r *Run) SetTotal(batches int64) { r.prog.total.Store(max(batches, 0)) }

// Resumed says how many batches earlier runs of the same work committed
// (a resumed bill run skips them): they count as committed.
func (r *Run) Resumed(batches int64) { r.prog.resumed.Store(max(batches, 0)) }

// Committed records batches (and the rows in them) this run committed.
func (r *Run) Committed(batches, rows int64) {
	done := r.prog.committed.Add(batches)
	total := r.prog.rows.Add(rows)
	if began := r.prog.began.Load(); began > 0 {
		r.prog.timeline.add(ProgressPoint{At: time.Since(time.Unix(0, began)), Batches: r.prog.resumed.Load() + done, Rows: total})
	}
}

// Progress is a snapshot of a run's progress.
type Progress struct {
	Job, Key string
	// Replica, Fence, Trigger and Started name the run (Runner.InFlight):
	// its owner, claim fence, the request that started it, and when its
	// lock was taken.
	Replica string
	Fence   int64
	Trigger job.Trigger
	Started time.Time
	// BatchesCommitted counts every committed batch of the work: earlier
	// runs' (Resumed) and this run's.
	BatchesCommitted int64
	// BatchesTotal is the kind's count of batches in all; 0 not known.
	BatchesTotal int64
	// Rows are the rows this run committed.
	Rows int64
	// Elapsed is the time since the work began.
	Elapsed time.Duration
	// Percent is BatchesCommitted of BatchesTotal (0-100, one decimal);
	// -1 while the total is not known.
	Percent float64
	// RowsPerSecond is this run's rate since it began.
	RowsPerSecond float64
	// ETA is the time left at this run's batch rate; -1 while not known
	// (no total, or nothing committed yet).
	ETA time.Duration
}

// Known reports whether the total (and so Percent) is known.
func (p Progress) Known() bool { return p.Percent >= 0 }

// Progress returns the run's progress now.
func (r *Run) Progress() Progress {
	pr := &r.prog
	p := Progress{Job: r.job, Key: r.key, Replica: r.replica, Fence: r.fence, Trigger: r.trigger, Started: r.acquired,
		Percent: -1, ETA: -1}
	mine := pr.committed.Load()
	p.BatchesCommitted = pr.resumed.Load() + mine
	p.Rows = pr.rows.Load()
	// A total below what is committed is an estimate the work outgrew.
	p.BatchesTotal = pr.total.Load()
	if p.BatchesTotal > 0 {
		p.BatchesTotal = max(p.BatchesTotal, p.BatchesCommitted)
	}
	if began := pr.began.Load(); began > 0 {
		p.Elapsed = time.Since(time.Unix(0, began))
	}
	if secs := p.Elapsed.Seconds(); secs > 0 {
		p.RowsPerSecond = math.Round(float64(p.Rows)/secs*10) / 10
	}
	if p.BatchesTotal > 0 {
		p.Percent = math.Floor(1000*float64(p.BatchesCommitted)/float64(p.BatchesTotal)) / 10
		left := p.BatchesTotal - p.BatchesCommitted
		switch {
		case left == 0:
			p.ETA = 0
		case mine > 0 && p.Elapsed > 0:
			p.ETA = time.Duration(float64(p.Elapsed) / float64(mine) * float64(left))
		}
	}
	return p
}

// ProgressReporter shows the progress of the runs a Runner executes: a log
// record every interval (ProgressLog, the default), a live bar on a
// terminal (`coordinator run`).
type ProgressReporter interface {
	// Track starts showing run's progress when its work begins; the
	// returned stop is called once the work returned, before the run's
	// last event, and waits for the reporter to finish with it.
	Track(run *Run) (stop func())
}

// ProgressMessage is the message of a kind's progress log record: the
// kind's name with '-' as '_', then "_progress" (billrun_progress,
// msisdn_reaper_progress, msisdn_pool_progress).
func ProgressMessage(job string) string { return strings.ReplaceAll(job, "-", "_") + "_progress" }

// ProgressLog logs a run's progress every interval through the run's
// logger (job, lock_key, request_id and trace_id attached): message
// ProgressMessage(job), fields batches_committed, batches_total, percent,
// rows, rows_per_s, eta_s (batches_total, percent and eta_s null while not
// known), elapsed_s. A run shorter than interval logs none.
// interval <= 0 logs nothing.
func ProgressLog(interval time.Duration) ProgressReporter { return logReporter{interval: interval} }

type logReporter struct{ interval time.Duration }

func (l logReporter) Track(run *Run) func() {
	if l.interval <= 0 {
		return func() {}
	}
	// A timer, not a goroutine: a run shorter than the interval costs one
	// timer and nothing else.
	t := &logTick{run: run, msg: ProgressMessage(run.job), interval: l.interval}
	t.mu.Lock()
	t.timer = time.AfterFunc(l.interval, t.fire)
	t.mu.Unlock()
	return t.stop
}

// logTick logs one run's progress every interval until stopped.
type logTick struct {
	run      *Run
	msg      string
	interval time.Duration

	mu      sync.Mutex // held while logging, so stop waits for a record being written
	timer   *time.Timer
	stopped bool
}

func (t *logTick) fire() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.run.Log().LogAttrs(context.Background(), slog.LevelInfo, t.msg, ProgressAttrs(t.run.Progress())...)
	t.timer.Reset(t.interval)
}

func (t *logTick) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	t.timer.Stop()
}

// ProgressAttrs are the fields of a progress log record.
func ProgressAttrs(p Progress) []slog.Attr {
	total, percent, eta := slog.Any("batches_total", nil), slog.Any("percent", nil), slog.Any("eta_s", nil)
	if p.Known() {
		total, percent = slog.Int64("batches_total", p.BatchesTotal), slog.Float64("percent", p.Percent)
	}
	if p.ETA >= 0 {
		eta = slog.Int64("eta_s", int64(math.Ceil(p.ETA.Seconds())))
	}
	return []slog.Attr{
		slog.Int64("batches_committed", p.BatchesCommitted), total, percent,
		slog.Int64("rows", p.Rows), slog.Float64("rows_per_s", p.RowsPerSecond), eta,
		slog.Float64("elapsed_s", math.Round(p.Elapsed.Seconds()*10)/10),
	}
}

// inFlight is the runs a Runner is executing, for the progress gauges.
type inFlight struct {
	mu   sync.Mutex
	runs map[*Run]struct{}
}

func (f *inFlight) add(r *Run) {
	f.mu.Lock()
	if f.runs == nil {
		f.runs = map[*Run]struct{}{}
	}
	f.runs[r] = struct{}{}
	f.mu.Unlock()
}

func (f *inFlight) remove(r *Run) {
	f.mu.Lock()
	delete(f.runs, r)
	f.mu.Unlock()
}

func (f *inFlight) snapshot() []Progress {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Progress, 0, len(f.runs))
	for r := range f.runs {
		out = append(out, r.Progress())
	}
	return out
}
