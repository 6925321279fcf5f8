package billrun_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/telemetry"
)

// lines collects JSON log lines and signals each write.
type lines struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	all   []map[string]any
	wrote chan struct{}
}

func newLines() *lines { return &lines{wrote: make(chan struct{})} }

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		b, err := l.buf.ReadBytes('\n')
		if err != nil {
			l.buf.Write(b)
			break
		}
		var m map[string]any
		if json.Unmarshal(b, &m) == nil {
			l.all = append(l.all, m)
		}
	}
	close(l.wrote)
	l.wrote = make(chan struct{})
	return len(p), nil
}

// waitFor returns the first line with message msg for which ok holds.
func (l *lines) waitFor(t *testing.T, msg string, ok func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		l.mu.Lock()
		all, ch := l.all, l.wrote
		l.mu.Unlock()
		for _, m := range all {
			if m["msg"] == msg && ok(m) {
				return m
			}
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no matching %s line in %v", msg, all)
		}
	}
}

// pauseAt blocks the nth batch (and the ones after it) until release is
// closed; reached closes when the nth batch is about to start.
func pauseAt(n int, reached chan<- struct{}, release <-chan struct{}) func(ctx context.Context, _, _ int64) error {
	var mu sync.Mutex
	seen := 0
	return func(ctx context.Context, _, _ int64) error {
		mu.Lock()
		seen++
		at := seen
		mu.Unlock()
		if at < n {
			return nil
		}
		if at == n {
			close(reached)
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func ptr[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// A bill run's progress while it runs, as every reader sees it: the
// billrun_progress log record, the status API, and at the end percent 100.
func TestProgressInLogsAndStatusWhileRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seeded := b.seed(t, billrun.SeedConfig{Subscribers: 500, SuspendedRatio: 0.1})
	batches := (seeded.Active + 24) / 25
	reached, release := make(chan struct{}), make(chan struct{})
	logs := newLines()
	k := billrun.New(billrun.WithBeforeBatch(billrun.Config{BatchSize: 25, Workers: 1, Logger: slog.New(slog.NewJSONHandler(logs, nil))},
		pauseAt(6, reached, release)))
	reg, err := owned.NewRegistry(k)
	require.NoError(t, err)
	tmpl, err := owned.NewRunner(reg, owned.RunnerConfig{ProgressInterval: 100 * time.Millisecond, Emit: b.rec,
		Deps: owned.Deps{DB: b.pool, Locker: b.locker, Log: slog.New(slog.NewJSONHandler(logs, nil))}})
	require.NoError(t, err)
	done := make(chan job.Result, 1)
	go func() {
		done <- tmpl.Run(context.Background(), k, params(k, billrun.Request{Period: period}), job.Trigger{Source: job.SourceCLI, RequestID: "progress-1"})
	}()
	<-reached // 5 batches committed, the 6th waits

	// A line logged before the pause may have the total and fewer batches:
	// wait for one at the pause.
	line := logs.waitFor(t, "billrun_progress", func(m map[string]any) bool {
		return m["batches_total"] != nil && m["batches_committed"] == float64(5)
	})
	require.Equal(t, float64(batches), line["batches_total"], "the count of ACTIVE subscribers, in batches")
	require.Equal(t, float64(int64(1000*5/batches))/10, line["percent"])
	require.Equal(t, float64(5*25), line["rows"])
	require.Equal(t, "progress-1", line["request_id"])
	require.NotNil(t, line["eta_s"])

	var st billrun.Status
	require.Eventually(t, func() bool { // the total is written beside the first batches
		st, err = billrun.ReadStatus(context.Background(), b.pool, period)
		return err == nil && st.Progress.BatchesTotal != nil && *st.Progress.BatchesTotal == batches
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, billrun.StatusRunning, st.Status)
	require.Equal(t, int64(5), st.Progress.BatchesCommitted)
	require.Equal(t, float64(int64(1000*5/batches))/10, ptr(st.Progress.Percent))
	require.NotNil(t, st.Progress.ETASeconds)
	require.Positive(t, st.Progress.RowsPerSecond)
	js, err := json.Marshal(st)
	require.NoError(t, err)
	require.Contains(t, string(js), `"progress":{"batches_committed":5,"batches_total":`)

	close(release)
	res := <-done
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	st, err = billrun.ReadStatus(context.Background(), b.pool, period)
	require.NoError(t, err)
	require.Equal(t, 100.0, ptr(st.Progress.Percent))
	require.Equal(t, batches, ptr(st.Progress.BatchesTotal))
	require.Nil(t, st.Progress.ETASeconds, "nothing left")
}

// A resumed run counts the batches of the run before it as committed.
func TestResumedProgressCountsEarlierBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seeded := b.seed(t, billrun.SeedConfig{Subscribers: 300})
	batches := (seeded.Active + 24) / 25
	key := billrun.LockKey(period)
	res := b.runner(billrun.WithBeforeBatch(billrun.Config{Workers: 1}, stopAfter(4, func() { b.locker.DeleteLock(key) }))).
		Run(context.Background(), period, trig())
	require.Equal(t, job.OutcomeLost, res.Outcome)
	st, err := billrun.ReadStatus(context.Background(), b.pool, period)
	require.NoError(t, err)
	require.Equal(t, billrun.StatusInterrupted, st.Status)
	require.Equal(t, int64(4), st.Progress.BatchesCommitted)
	require.Equal(t, batches, ptr(st.Progress.BatchesTotal), "the plan was complete before the loss")
	require.Nil(t, st.Progress.ETASeconds, "not running")

	var seen []owned.Progress
	var mu sync.Mutex
	k := billrun.New(billrun.WithBeforeBatch(billrun.Config{BatchSize: 25, Workers: 1}, func(context.Context, int64, int64) error { return nil }))
	reg, err := owned.NewRegistry(k)
	require.NoError(t, err)
	tmpl, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: b.pool, Locker: b.locker}, Progress: recordProgress(&mu, &seen), Emit: b.rec})
	require.NoError(t, err)
	res = tmpl.Run(context.Background(), k, params(k, billrun.Request{Period: period}), trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, seen)
	last := seen[len(seen)-1]
	require.Equal(t, batches, last.BatchesCommitted, "4 resumed + the rest")
	require.Equal(t, batches, last.BatchesTotal)
	require.Equal(t, 100.0, last.Percent)
	require.Equal(t, seeded.Active-4*25, last.Rows, "rows are this run's")
}

// recordProgress is a reporter that keeps the progress it saw when each
// run's work ended.
func recordProgress(mu *sync.Mutex, seen *[]owned.Progress) owned.ProgressReporter {
	return reporterFunc(func(run *owned.Run) func() {
		return func() {
			mu.Lock()
			*seen = append(*seen, run.Progress())
			mu.Unlock()
		}
	})
}

type reporterFunc func(run *owned.Run) func()

func (f reporterFunc) Track(run *owned.Run) func() { return f(run) }

// Each batch is a span of the run's trace.
func TestEachBatchIsASpan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 120})
	sr := tracetest.NewSpanRecorder()
	k := billrun.New(billrun.Config{BatchSize: 25})
	reg, err := owned.NewRegistry(k)
	require.NoError(t, err)
	tmpl, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: b.pool, Locker: b.locker},
		Tracer: telemetry.NewForTest(sr, nil).TracerIfOn(owned.TracerName), Emit: b.rec})
	require.NoError(t, err)
	res := tmpl.Run(context.Background(), k, params(k, billrun.Request{Period: period}), trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	var run string
	parents := map[string]int{}
	var rows int64
	for _, s := range sr.Ended() {
		switch s.Name() {
		case "run billrun":
			run = s.SpanContext().SpanID().String()
		case "billrun.batch":
			parents[s.Parent().SpanID().String()]++
			for _, a := range s.Attributes() {
				if a.Key == "billrun.subscribers" {
					rows += a.Value.AsInt64()
				}
			}
		}
	}
	require.Equal(t, map[string]int{run: int(res.Counts["batches_committed"])}, parents, "one span per batch, children of the run")
	require.Equal(t, res.Counts["subscribers"], rows)
}

// A batch in flight holds the bill_runs row FOR SHARE (its fence check),
// and with several workers one nearly always is: storing the run's total
// must not wait for them. It used to be an UPDATE of that row, which
// waited until no batch held it (on 1M subscribers and 4 workers: never,
// until its 5 s bound; the status showed no total for the whole run).
func TestTotalIsStoredWhileBatchesHoldTheClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 100})
	reached, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) }) // a failure below must not leave the run waiting
	done := make(chan job.Result, 1)
	go func() {
		done <- b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 25, Workers: 1}, pauseAt(2, reached, release))).
			Run(context.Background(), period, trig())
	}()
	select { // one batch committed, the second waits: the run is RUNNING
	case <-reached:
	case res := <-done:
		t.Fatalf("the run ended before its second batch: %+v", res)
	}
	st, err := billrun.ReadStatus(context.Background(), b.pool, period)
	require.NoError(t, err)
	require.Equal(t, billrun.StatusRunning, st.Status)

	inFlight, err := b.pool.Begin(context.Background()) // a batch of this claim, in flight
	require.NoError(t, err)
	t.Cleanup(func() { _ = inFlight.Rollback(context.Background()) })
	_, err = inFlight.Exec(context.Background(), `select 1 from bill_runs where period = $1 and fence = $2 for share`, period.String(), st.Fence)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second) // the bound is the behaviour: it must not wait
	defer cancel()
	require.NoError(t, billrun.RecordTotal(ctx, b.pool, period, st.Fence, 77), "storing the total waited for a batch's FOR SHARE")
	st, err = billrun.ReadStatus(context.Background(), b.pool, period)
	require.NoError(t, err)
	require.Equal(t, int64(77), ptr(st.Progress.BatchesTotal))

	// Under a stale fence nothing is stored.
	require.NoError(t, billrun.RecordTotal(ctx, b.pool, period, st.Fence-1, 5))
	st, err = billrun.ReadStatus(context.Background(), b.pool, period)
	require.NoError(t, err)
	require.Equal(t, int64(77), ptr(st.Progress.BatchesTotal))

	require.NoError(t, inFlight.Rollback(context.Background()))
	releaseOnce.Do(func() { close(release) })
	res := <-done
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	st, err = billrun.ReadStatus(context.Background(), b.pool, period)
	require.NoError(t, err)
	require.Equal(t, 100.0, ptr(st.Progress.Percent))
}

// The progress total's estimate leaves in what this claim's own batches
// bill: they are planned by this run, not skipped. It subtracted every
// committed batch, so a count that finished after the run's first commits
// (and a run lost before its plan was complete, whose total is never made
// exact) showed a total short by them: TestResumedProgressCountsEarlierBatches
// failed in CI with 11 of 12.
func TestCountToPlanLeavesThisClaimsBatchesIn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 100})
	ctx := context.Background()
	start, end, cutoff := period.Start(time.UTC), period.End(time.UTC), time.Now()
	all, err := billrun.CountToPlan(ctx, b.pool, period, start, end, cutoff, 2)
	require.NoError(t, err)
	require.Positive(t, all)
	_, err = b.pool.Exec(ctx, `insert into bill_runs (period, status, owner, fence) values ($1, 'RUNNING', 'r', 2)`, period.String())
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `insert into bill_run_batches (period, first_id, last_id, fence, owner, subscribers, invoices_created, already_invoiced)
		values ($1, 1, 25, 1, 'r', 25, 25, 0), ($1, 26, 75, 2, 'r', 50, 50, 0)`, period.String())
	require.NoError(t, err)
	left, err := billrun.CountToPlan(ctx, b.pool, period, start, end, cutoff, 2)
	require.NoError(t, err)
	require.Equal(t, all-25, left, "only the earlier claim's batch is done before this run")
}
