package owned_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type bundle struct {
	runner *owned.Runner
	locker *ownership.MemoryLocker
	rec    *events.Recorder
	kind   *ownedtest.Widget
	reg    *prometheus.Registry
}

func setup(t *testing.T, w *ownedtest.Widget) *bundle {
	t.Helper()
	// Renewed every second: a lease a run needs is lost only if renewal stalls
	// for ~2s, which a busy machine does not do (600ms TTLs lost it at ~370ms).
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a", WaitTime: 50 * time.Millisecond, WatchdogTimeout: 3 * time.Second})
	t.Cleanup(func() { _ = l.Close() })
	return setupWith(t, w, l, l)
}

func setupWith(t *testing.T, w *ownedtest.Widget, l ownership.Locker, mem *ownership.MemoryLocker) *bundle {
	t.Helper()
	reg, err := owned.NewRegistry(w.Kind())
	require.NoError(t, err)
	b := &bundle{locker: mem, rec: &events.Recorder{}, kind: w, reg: prometheus.NewRegistry()}
	b.runner, err = owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{Locker: l, Registerer: b.reg}, Replica: l.Owner(), Emit: b.rec})
	require.NoError(t, err)
	return b
}

func (b *bundle) run(ctx context.Context, n int) job.Result {
	return b.runner.Run(ctx, b.kind.Kind(), b.kind.Params(n), job.Trigger{Source: job.SourceCLI, RequestID: "req-1",
		RequestedBy: "alice", Principal: "ops-token"})
}

func (b *bundle) requireNoLocks(t *testing.T) {
	t.Helper()
	locks, err := b.locker.Locks(context.Background())
	require.NoError(t, err)
	require.Empty(t, locks, "the lock is released on this path")
}

// Every way a kind's work can end, and what the template makes of it: the
// outcome (and so the exit code and whether a Kafka offset is committed),
// the events, the counts, and the lock given back.
func TestOutcomePerErrorEventsAndRelease(t *testing.T) {
	t.Parallel()
	errBoom := errors.New("boom")
	cases := []struct {
		name     string
		run      func(ctx context.Context, r *owned.Run, b *bundle) (owned.Report, error)
		cancel   bool // the caller's ctx is cancelled once the work started
		outcome  job.Outcome
		events   []events.Type
		reason   string
		errorHas string
	}{
		{name: "nil is completed",
			run: func(context.Context, *owned.Run, *bundle) (owned.Report, error) {
				return owned.Report{Counts: map[string]int64{"done": 3}, Data: map[string]any{"stopped": "drained"}}, nil
			},
			outcome: job.OutcomeCompleted, events: []events.Type{events.OwnershipAcquired, events.RunCompleted, events.OwnershipReleased}},
		{name: "an error is failed",
			run: func(context.Context, *owned.Run, *bundle) (owned.Report, error) {
				return owned.Report{Counts: map[string]int64{"done": 1}}, errBoom
			},
			outcome: job.OutcomeFailed, errorHas: "boom",
			events: []events.Type{events.OwnershipAcquired, events.RunFailed, events.OwnershipReleased}},
		{name: "bad input found late is failed",
			run: func(context.Context, *owned.Run, *bundle) (owned.Report, error) {
				return owned.Report{}, job.BadInput("row 7 is not a widget")
			},
			outcome: job.OutcomeFailed, errorHas: "row 7",
			events: []events.Type{events.OwnershipAcquired, events.RunFailed, events.OwnershipReleased}},
		{name: "a kind's own lost reason",
			run: func(context.Context, *owned.Run, *bundle) (owned.Report, error) {
				return owned.Report{Counts: map[string]int64{"done": 2}}, owned.Lost("fence_lost", nil)
			},
			outcome: job.OutcomeLost, reason: "fence_lost", errorHas: "fence_lost",
			events: []events.Type{events.OwnershipAcquired, events.OwnershipLost, events.OwnershipReleased}},
		{name: "lease lost mid-run: no release, the lock is gone",
			run: func(ctx context.Context, r *owned.Run, b *bundle) (owned.Report, error) {
				b.locker.DeleteLock(r.Key())
				return owned.Report{}, waitCtx(ctx)
			},
			outcome: job.OutcomeLost, reason: owned.ReasonLeaseLost, errorHas: owned.ReasonLeaseLost,
			events: []events.Type{events.OwnershipAcquired, events.OwnershipLost}},
		{name: "work completed under its fence after the lease was lost: the term still ends in the events",
			run: func(ctx context.Context, r *owned.Run, b *bundle) (owned.Report, error) {
				b.locker.DeleteLock(r.Key())
				<-ctx.Done()
				return owned.Report{}, nil // every step committed under the store's fence
			},
			outcome: job.OutcomeCompleted,
			events:  []events.Type{events.OwnershipAcquired, events.RunCompleted, events.OwnershipLost}},
		{name: "shutdown mid-run releases",
			run: func(ctx context.Context, _ *owned.Run, _ *bundle) (owned.Report, error) {
				return owned.Report{}, waitCtx(ctx)
			},
			cancel:  true,
			outcome: job.OutcomeLost, reason: owned.ReasonShutdown, errorHas: owned.ReasonShutdown,
			events: []events.Type{events.OwnershipAcquired, events.OwnershipLost, events.OwnershipReleased}},
		{name: "work done although shutdown began is completed",
			run: func(ctx context.Context, _ *owned.Run, _ *bundle) (owned.Report, error) {
				<-ctx.Done()
				return owned.Report{}, nil // every step committed: the kind says done
			},
			cancel:  true,
			outcome: job.OutcomeCompleted,
			events:  []events.Type{events.OwnershipAcquired, events.RunCompleted, events.OwnershipReleased}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := &ownedtest.Widget{}
			b := setup(t, w)
			started := make(chan struct{})
			w.Work = func(ctx context.Context, r *owned.Run, _ int) (owned.Report, error) {
				close(started)
				return tc.run(ctx, r, b)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				go func() { <-started; cancel() }()
			}
			res := b.run(ctx, 4)
			require.Equal(t, tc.outcome, res.Outcome, res.Error)
			require.Equal(t, "widget", res.Job)
			require.Equal(t, "widget:4", res.Key)
			require.Equal(t, "replica-a", res.Replica)
			require.Equal(t, "replica-a", res.Owner)
			require.Positive(t, res.Fence)
			require.Equal(t, "req-1", res.RequestID)
			if tc.errorHas != "" {
				require.Contains(t, res.Error, tc.errorHas)
			}
			require.Equal(t, tc.events, types(b.rec.Events()))
			for _, e := range b.rec.Events() {
				require.Equal(t, "widget:4", e.Key)
				require.Equal(t, "widget", e.Job)
				require.Equal(t, "replica-a", e.Replica)
				require.Equal(t, "cli", e.Trigger)
				require.Equal(t, "req-1", e.RequestID)
				// Who asked reaches every event of every kind, stamped by the template.
				require.Equal(t, "alice", e.RequestedBy)
				require.Equal(t, "ops-token", e.Principal)
				require.Equal(t, "alice", e.Cloud().Data["requested_by"])
				require.Equal(t, "ops-token", e.Cloud().Data["principal"])
				require.Equal(t, res.Fence, e.Fence)
				require.Equal(t, res.Fence, e.Extra["lock_fence"])
			}
			last := b.rec.Events()[1]
			for k, v := range res.Counts {
				require.Equal(t, v, last.Extra[k], "counts are in the last event")
			}
			if tc.reason != "" {
				require.Equal(t, tc.reason, last.Extra["reason"])
			}
			if tc.outcome == job.OutcomeFailed {
				require.Equal(t, res.Error, last.Extra["error"])
			}
			if tc.name == "nil is completed" {
				require.Equal(t, map[string]int64{"done": 3}, res.Counts)
				require.Equal(t, "drained", last.Extra["stopped"])
			}
			b.requireNoLocks(t)
			require.Equal(t, []job.Result{res}, w.Results(), "the Observer sees the final result once")
		})
	}
}

// Another replica holds the lock: already_owned names it, nothing runs,
// and its lock is left alone. On the real Redis adapter.
func TestAlreadyOwnedNamesTheOwnerAndRunsNothing(t *testing.T) {
	t.Parallel()
	rd := testenv.Redis(t)
	locker := func(owner string) *redislock.Locker {
		c, err := redislock.NewClient(rd.URL, "single")
		require.NoError(t, err)
		l, err := redislock.New(c, redislock.Config{Prefix: rd.Prefix, Owner: owner, WaitTime: 100 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(); _ = c.Close() })
		return l
	}
	holder := locker("replica-a")
	held, err := holder.Acquire(context.Background(), "widget:9", 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, held.Release(context.Background())) }()

	w := &ownedtest.Widget{Name: "widget"}
	b := setupWith(t, w, locker("replica-b"), nil)
	res := b.run(context.Background(), 9)
	require.Equal(t, job.OutcomeAlreadyOwned, res.Outcome)
	require.Equal(t, job.ExitAlreadyOwned, res.Outcome.ExitCode())
	require.Equal(t, "replica-a", res.Owner, "the result names the owner")
	require.Equal(t, "replica-b", res.Replica)
	require.Contains(t, res.Error, ownership.CodeLockAcquisitionFailed)
	require.Zero(t, w.Runs(), "nothing ran")
	require.Equal(t, []events.Type{events.OwnershipAlreadyOwned}, types(b.rec.Events()))
	ev := b.rec.Events()[0]
	require.Equal(t, "replica-a", ev.Owner, "the event names the owner")
	require.Equal(t, "replica-b", ev.Replica)
	require.Equal(t, ownership.CodeLockAcquisitionFailed, ev.Extra["code"])
	require.Equal(t, "already_owned", ev.Extra["reason"])
	require.Equal(t, "alice", ev.RequestedBy, "a refused request still names who asked")
	require.Equal(t, "ops-token", ev.Principal)
	require.Nil(t, held.Err(), "the owner's lock is untouched")
}

func TestUnavailableFailsClosed(t *testing.T) {
	t.Parallel()
	w := &ownedtest.Widget{}
	b := setup(t, w)
	b.locker.SetUnavailable(true)
	res := b.run(context.Background(), 1)
	require.Equal(t, job.OutcomeUnavailable, res.Outcome)
	require.False(t, res.Outcome.Handled(), "a Kafka trigger is retried")
	require.Zero(t, w.Runs())
	require.Equal(t, []events.Type{events.OwnershipUnavailable}, types(b.rec.Events()))
	require.Equal(t, "unavailable", b.rec.Events()[0].Extra["reason"])
	require.NotEmpty(t, b.rec.Events()[0].Extra["error"])
}

func TestClaim(t *testing.T) {
	t.Parallel()
	t.Run("a claim's fence is on every later event", func(t *testing.T) {
		t.Parallel()
		w := &ownedtest.Widget{Claim: func(context.Context, *owned.Run, int) (int64, error) { return 42, nil }}
		w.Work = func(ctx context.Context, r *owned.Run, _ int) (owned.Report, error) {
			require.Equal(t, int64(42), r.Fence())
			r.Emit(ctx, events.BillrunInvoiceConflict, map[string]any{"sample": []int64{1}})
			return owned.Report{}, nil
		}
		b := setup(t, w)
		o, res := b.runner.Begin(context.Background(), w.Kind(), w.Params(1), job.Trigger{Source: job.SourceHTTP})
		require.NotNil(t, o, res.Error)
		require.Empty(t, res.Outcome, "owned and claimed, not ended")
		require.Equal(t, int64(42), res.Fence)
		require.Equal(t, int64(42), o.Fence())
		res = o.Execute(context.Background())
		require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
		require.Equal(t, job.OutcomeFailed, o.Execute(context.Background()).Outcome, "Execute runs once")
		evs := b.rec.Events()
		require.Equal(t, []events.Type{events.OwnershipAcquired, events.BillrunInvoiceConflict, events.RunCompleted, events.OwnershipReleased}, types(evs))
		lockFence := evs[0].Fence
		for _, e := range evs[1:] {
			require.Equal(t, int64(42), e.Fence)
			require.Equal(t, lockFence, e.Extra["lock_fence"])
		}
		require.Equal(t, 1, w.Runs())
		b.requireNoLocks(t)
	})
	t.Run("already completed runs nothing and names who did it", func(t *testing.T) {
		t.Parallel()
		w := &ownedtest.Widget{Claim: func(context.Context, *owned.Run, int) (int64, error) {
			return 0, &owned.CompletedError{Owner: "replica-z", Fence: 7, Counts: map[string]int64{"total": 9}}
		}}
		b := setup(t, w)
		res := b.run(context.Background(), 1)
		require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome)
		require.Equal(t, job.ExitOK, res.Outcome.ExitCode())
		require.Equal(t, "replica-z", res.Owner)
		require.Equal(t, int64(7), res.Fence)
		require.Equal(t, map[string]int64{"total": 9}, res.Counts)
		require.Zero(t, w.Runs())
		evs := b.rec.Events()
		require.Equal(t, []events.Type{events.OwnershipAcquired, events.RunAlreadyCompleted, events.OwnershipReleased}, types(evs))
		require.Equal(t, "replica-z", evs[1].Owner)
		require.Equal(t, int64(7), evs[1].Fence)
		require.Equal(t, int64(9), evs[1].Extra["total"])
		b.requireNoLocks(t)
	})
	t.Run("already completed, answered before the lock", func(t *testing.T) {
		t.Parallel()
		claimed := 0
		w := &ownedtest.Widget{
			Claim: func(context.Context, *owned.Run, int) (int64, error) { claimed++; return 1, nil },
			AlreadyCompleted: func(_ context.Context, r *owned.Run, n int) (*owned.CompletedError, error) {
				require.Zero(t, r.LockFence(), "no lock is held while the kind looks")
				if n == 1 {
					return &owned.CompletedError{Owner: "replica-z", Fence: 7, Counts: map[string]int64{"total": 9}}, nil
				}
				if n == 2 {
					return nil, errors.New("store down")
				}
				return nil, nil
			},
		}
		b := setup(t, w)
		b.locker.SetUnavailable(true) // the lock cannot be taken: only an answer before it completes
		res := b.run(context.Background(), 1)
		require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome, res.Error)
		require.Equal(t, "replica-z", res.Owner)
		require.Equal(t, int64(7), res.Fence)
		require.Equal(t, map[string]int64{"total": 9}, res.Counts)
		require.Zero(t, claimed)
		require.Zero(t, w.Runs())
		evs := b.rec.Events()
		require.Equal(t, []events.Type{events.RunAlreadyCompleted}, types(evs), "nothing acquired, nothing released")
		require.Equal(t, "replica-z", evs[0].Owner)
		require.Equal(t, int64(7), evs[0].Fence)
		require.Equal(t, int64(9), evs[0].Extra["total"])
		require.Equal(t, true, evs[0].Extra[owned.DataBeforeLock])
		require.NotContains(t, evs[0].Extra, "lock_fence")
		require.Equal(t, []job.Outcome{job.OutcomeAlreadyCompleted}, outcomes(w.Results()))

		// The kind cannot tell, or fails to: the lock decides.
		for _, n := range []int{2, 3} {
			res = b.run(context.Background(), n)
			require.Equal(t, job.OutcomeUnavailable, res.Outcome, "n=%d", n)
		}
		b.locker.SetUnavailable(false)
		res = b.run(context.Background(), 3)
		require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
		require.Equal(t, 1, claimed)
		b.requireNoLocks(t)
	})
	t.Run("a failed claim is failed and releases", func(t *testing.T) {
		t.Parallel()
		w := &ownedtest.Widget{Claim: func(context.Context, *owned.Run, int) (int64, error) { return 0, errors.New("no table") }}
		b := setup(t, w)
		res := b.run(context.Background(), 1)
		require.Equal(t, job.OutcomeFailed, res.Outcome)
		require.Contains(t, res.Error, "no table")
		require.Zero(t, w.Runs())
		require.Equal(t, []events.Type{events.OwnershipAcquired, events.RunFailed, events.OwnershipReleased}, types(b.rec.Events()))
		b.requireNoLocks(t)
	})
}

func TestMinHoldDefersTheRelease(t *testing.T) {
	t.Parallel()
	// The checks below run within the hold: 3s of it, so that a busy
	// machine does not let it run out first.
	const hold = 3 * time.Second
	w := &ownedtest.Widget{Lease: owned.Lease{TTL: 100 * time.Millisecond, MinHold: hold}}
	b := setup(t, w)
	res := b.run(context.Background(), 1)
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	rel := b.rec.OfType(events.OwnershipReleased)
	require.Len(t, rel, 1)
	require.Equal(t, "after_min_hold", rel[0].Extra["release"])
	require.Equal(t, hold.Milliseconds(), rel[0].Extra["min_hold_ms"])
	locks, err := b.locker.Locks(context.Background())
	require.NoError(t, err)
	require.Len(t, locks, 1, "held through the minimum hold, past the lease's own 100ms")
	// A second trigger within the hold is told the sweep is owned.
	require.Equal(t, job.OutcomeAlreadyOwned, b.run(context.Background(), 1).Outcome)
	require.Eventually(t, func() bool {
		locks, err := b.locker.Locks(context.Background())
		return err == nil && len(locks) == 0
	}, 10*time.Second, 10*time.Millisecond, "released by timer at acquired + MinHold")
	require.Equal(t, job.OutcomeCompleted, b.run(context.Background(), 1).Outcome)
}

// Close releases the locks kept for a minimum hold at once (a process
// that exits: its timers end with it); a hold taken afterwards keeps its
// timer.
func TestCloseReleasesTheHeldLocksNow(t *testing.T) {
	t.Parallel()
	w := &ownedtest.Widget{Lease: owned.Lease{TTL: time.Minute, MinHold: time.Hour}}
	b := setup(t, w)
	require.Equal(t, job.OutcomeCompleted, b.run(context.Background(), 1).Outcome)
	locks, err := b.locker.Locks(context.Background())
	require.NoError(t, err)
	require.Len(t, locks, 1, "kept for the minimum hold")
	b.runner.Close()
	b.requireNoLocks(t)
	b.runner.Close() // twice: nothing left
	require.Equal(t, job.OutcomeCompleted, b.run(context.Background(), 2).Outcome)
	locks, err = b.locker.Locks(context.Background())
	require.NoError(t, err)
	require.Len(t, locks, 1, "the Runner still runs, and holds again")
	b.runner.Close()
	b.requireNoLocks(t)
}

func TestLockKeyOutsideTheNamespaceFailsWithoutLocking(t *testing.T) {
	t.Parallel()
	w := &ownedtest.Widget{Name: "gadget"}
	b := setup(t, w)
	other := &ownedtest.Widget{Name: "other"}
	res := b.runner.Run(context.Background(), other.Kind(), other.Params(1), job.Trigger{Source: job.SourceCLI})
	require.Equal(t, job.OutcomeFailed, res.Outcome)
	require.Contains(t, res.Error, "not registered")
	b.requireNoLocks(t)

	// A kind's Params given to another kind: failed, nothing locked, no cast.
	res = b.runner.Run(context.Background(), w.Kind(), other.Params(1), job.Trigger{Source: job.SourceCLI})
	require.Equal(t, job.OutcomeFailed, res.Outcome)
	require.Contains(t, res.Error, `kind "gadget" given the params of kind "other"`)
	res = b.runner.Run(context.Background(), w.Kind(), owned.Params{}, job.Trigger{Source: job.SourceCLI})
	require.Equal(t, job.OutcomeFailed, res.Outcome)
	b.requireNoLocks(t)

	liar := owned.Define(owned.Def[ownedtest.Params]{
		Spec:    owned.Spec{Name: "liar"},
		Decode:  func(owned.Input) (ownedtest.Params, error) { return ownedtest.Params{N: 1}, nil },
		LockKey: func(ownedtest.Params) string { return "billrun:2026-11" }, // another kind's namespace
		Open: func(owned.Deps) (owned.Worker[ownedtest.Params], error) {
			return owned.Worker[ownedtest.Params]{Run: func(context.Context, *owned.Run, ownedtest.Params) (owned.Report, error) {
				t.Error("the liar's work ran")
				return owned.Report{}, nil
			}}, nil
		},
	})
	reg, err := owned.NewRegistry(liar)
	require.NoError(t, err)
	r, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{Locker: b.locker}, Emit: b.rec})
	require.NoError(t, err)
	p, err := owned.NewParams(liar, ownedtest.Params{N: 1})
	require.NoError(t, err)
	res = r.Run(context.Background(), liar, p, job.Trigger{Source: job.SourceCLI})
	require.Equal(t, job.OutcomeFailed, res.Outcome)
	require.Contains(t, res.Error, "outside its namespace")
	b.requireNoLocks(t)
	_, err = owned.NewParams(liar, 7)
	require.ErrorContains(t, err, `kind "liar" does not take params of type int`)
}

func TestRunMetrics(t *testing.T) {
	t.Parallel()
	w := &ownedtest.Widget{}
	b := setup(t, w)
	require.Equal(t, job.OutcomeCompleted, b.run(context.Background(), 1).Outcome)
	b.locker.SetUnavailable(true)
	require.Equal(t, job.OutcomeUnavailable, b.run(context.Background(), 1).Outcome)
	families, err := b.reg.Gather()
	require.NoError(t, err)
	counts := map[string]uint64{}
	for _, f := range families {
		if f.GetName() != "coordinator_run_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			require.Equal(t, "widget", labels["job"])
			counts[labels["outcome"]] += m.GetHistogram().GetSampleCount()
		}
	}
	// Every outcome's series exists (at 0 until it happens), so an alert's
	// increase() sees the first lost or failed run.
	require.Equal(t, map[string]uint64{"completed": 1, "unavailable": 1, "already_completed": 0, "already_owned": 0,
		"lost": 0, "failed": 0}, counts)
}

func outcomes(rs []job.Result) []job.Outcome {
	out := make([]job.Outcome, len(rs))
	for i, r := range rs {
		out[i] = r.Outcome
	}
	return out
}
