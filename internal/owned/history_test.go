package owned_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
	"github.com/telco-platform/coordinator/internal/ownership"
)

type history struct {
	mu   sync.Mutex
	recs []owned.RunRecord
}

func (h *history) RunEnded(r owned.RunRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r)
}

func (h *history) records() []owned.RunRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]owned.RunRecord(nil), h.recs...)
}

// The template records every run that held its lock, once, at its outcome,
// with its progress over time; a refused acquisition is no run.
func TestRunHistoryRecordsEveryRunThatHeldItsLock(t *testing.T) {
	t.Parallel()
	w := &ownedtest.Widget{Name: "widget", Work: func(_ context.Context, r *owned.Run, n int) (owned.Report, error) {
		r.SetTotal(4)
		for range 4 {
			r.Committed(1, 10)
		}
		if n == 2 {
			return owned.Report{Counts: map[string]int64{"n": 2}}, errors.New("boom")
		}
		return owned.Report{Counts: map[string]int64{"n": int64(n), "repaired": 1}}, nil
	}}
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a", WaitTime: 20 * time.Millisecond})
	t.Cleanup(func() { _ = l.Close() })
	reg, err := owned.NewRegistry(w.Kind())
	require.NoError(t, err)
	h := &history{}
	runner, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{Locker: l}, Replica: "replica-a", History: h, Emit: &events.Recorder{}})
	require.NoError(t, err)
	tr := job.Trigger{Source: job.SourceHTTP, RequestID: "q", RequestedBy: "alice", Principal: "ops"}
	ctx := context.Background()
	require.Equal(t, job.OutcomeCompleted, runner.Run(ctx, w.Kind(), w.Params(1), tr).Outcome)
	require.Equal(t, job.OutcomeFailed, runner.Run(ctx, w.Kind(), w.Params(2), tr).Outcome)
	held, err := l.Acquire(ctx, "widget:3", 0)
	require.NoError(t, err)
	require.Equal(t, job.OutcomeAlreadyOwned, runner.Run(context.WithoutCancel(ctx), w.Kind(), w.Params(3), tr).Outcome)
	require.NoError(t, held.Release(ctx))

	recs := h.records()
	require.Len(t, recs, 2, "already_owned held no lock: no record")
	done, failed := recs[0], recs[1]
	require.Equal(t, "widget:1", done.Key)
	require.Equal(t, job.OutcomeCompleted, done.Outcome)
	require.Equal(t, "replica-a", done.Replica)
	require.Equal(t, tr, done.Trigger)
	require.NotZero(t, done.Fence)
	require.Equal(t, done.Fence, done.LockFence)
	require.Equal(t, int64(1), done.Counts["repaired"])
	require.False(t, done.Started.IsZero())
	require.False(t, done.Ended.Before(done.Started))
	require.NotEmpty(t, done.Timeline)
	last := done.Timeline[len(done.Timeline)-1]
	require.Equal(t, int64(4), last.Batches)
	require.Equal(t, int64(40), last.Rows)
	require.Equal(t, job.OutcomeFailed, failed.Outcome)
	require.Equal(t, "boom", failed.Error)
}
