// Package ownershiptest is the conformance suite every ownership.Locker
// passes: the in-memory Locker and the Redis adapter run the same tests
// (River's riverdrivertest).
package ownershiptest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// Options configure one Locker of the suite.
type Options struct {
	Owner           string
	WaitTime        time.Duration
	WatchdogTimeout time.Duration
	// Metrics must reach the Locker: the suite reads its renewal counters
	// to tell why a lease ended, rather than guessing from elapsed time.
	Metrics *ownership.Metrics
}

// Backend is what an implementation gives the suite.
type Backend struct {
	// New returns a Locker on the backend (which may be shared by several
	// Lockers). The suite closes it.
	New func(t *testing.T, o Options) ownership.Locker
	// DeleteLock deletes key's lock behind its holder's back, as an
	// operator's DEL would. l is a Locker New returned.
	DeleteLock func(t *testing.T, l ownership.Locker, key string)
	// NewUnreachable returns a Locker whose backend cannot be reached.
	NewUnreachable func(t *testing.T, o Options) ownership.Locker
	// Shared: Lockers from New see each other's locks (separate processes
	// on one Redis); false for the in-memory Locker.
	Shared bool
}

// uniqueKey returns a key no other test uses.
func uniqueKey(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "conformance/" + name + "/" + hex.EncodeToString(b[:])
}

func newLocker(t *testing.T, b Backend, o Options) ownership.Locker {
	t.Helper()
	if o.Owner == "" {
		o.Owner = "replica-a"
	}
	if o.WaitTime == 0 {
		o.WaitTime = 5 * time.Second
	}
	if o.WatchdogTimeout == 0 {
		o.WatchdogTimeout = 600 * time.Millisecond
	}
	if o.Metrics == nil {
		o.Metrics = ownership.NewMetrics(nil)
	}
	l := b.New(t, o)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// waitClosed waits for ch to close within d and returns how long it took.
func waitClosed(t *testing.T, ch <-chan struct{}, d time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-ch:
		return time.Since(start)
	case <-time.After(d):
		t.Fatalf("%s: not within %s", what, d)
		return 0
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func renewals(m *ownership.Metrics, outcome string) float64 {
	return testutil.ToFloat64(m.RenewalsCounter(outcome))
}

// Run runs the conformance suite against b. Subtests run in parallel.
//
// Time bounds: a lower bound (not before the lease could have ended, not
// before the budget is spent) holds on any machine, since timers never fire
// early. An upper bound is asserted only where it is the behaviour, with
// seconds of margin for a busy machine, and with the alternative (a TTL, a
// wait budget) set far enough beyond it that a broken Locker still fails.
func Run(t *testing.T, b Backend) {
	ctx := context.Background()

	t.Run("MutualExclusion", func(t *testing.T) {
		t.Parallel()
		const workers, rounds = 8, 200
		l := newLocker(t, b, Options{WaitTime: 30 * time.Second})
		key := uniqueKey("mutex")
		var inside atomic.Int32
		var overlaps atomic.Int32
		var mu sync.Mutex
		var fences []int64
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for range workers {
			wg.Go(func() {
				for range rounds {
					le, err := l.Acquire(ctx, key, 0)
					if err != nil {
						errs <- err
						return
					}
					if inside.Add(1) != 1 {
						overlaps.Add(1)
					}
					mu.Lock()
					fences = append(fences, le.Fence())
					mu.Unlock()
					inside.Add(-1)
					if err := le.Release(ctx); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.Zero(t, overlaps.Load(), "two holders inside the critical section at once")
		require.Len(t, fences, workers*rounds)
		for i := 1; i < len(fences); i++ {
			require.Greater(t, fences[i], fences[i-1], "fence %d not above the previous one", i)
		}
	})

	t.Run("Reentrancy", func(t *testing.T) {
		t.Parallel()
		l := newLocker(t, b, Options{WaitTime: 50 * time.Millisecond})
		key := uniqueKey("reentry")
		outer, err := l.Acquire(ctx, key, 0)
		require.NoError(t, err)
		inner, err := l.Acquire(outer.Context(), key, 0)
		require.NoError(t, err, "acquire through the lease's context must be reentrant")
		require.Equal(t, outer.Fence(), inner.Fence())
		require.Equal(t, l.Owner(), inner.Owner())
		if insp, ok := l.(ownership.Inspector); ok {
			info := findLock(t, insp, key)
			require.EqualValues(t, 2, info.Holds)
			require.Equal(t, l.Owner(), info.Owner)
			require.Equal(t, outer.Fence(), info.Fence)
		}

		// Another goroutine of the same process is not reentrant.
		_, err = l.Acquire(ctx, key, 0)
		require.ErrorIs(t, err, ownership.ErrAlreadyOwned)

		require.NoError(t, inner.Release(ctx))
		require.ErrorIs(t, inner.Release(ctx), ownership.ErrNotHeld, "a second Release of one hold")
		require.Nil(t, outer.Err(), "releasing the inner hold must not end the lease")
		_, err = l.Acquire(ctx, key, 0)
		require.ErrorIs(t, err, ownership.ErrAlreadyOwned, "still held by the outer hold")

		require.NoError(t, outer.Release(ctx))
		require.ErrorIs(t, outer.Err(), ownership.ErrReleased)
		require.True(t, isClosed(outer.Done()))
		again, err := l.Acquire(ctx, key, 0)
		require.NoError(t, err)
		require.Greater(t, again.Fence(), outer.Fence())
		require.NoError(t, again.Release(ctx))
	})

	t.Run("WithLockReentrantAndReleases", func(t *testing.T) {
		t.Parallel()
		l := newLocker(t, b, Options{WaitTime: 50 * time.Millisecond})
		key := uniqueKey("withlock")
		boom := errors.New("boom")
		var fence int64
		err := ownership.WithLock(ctx, l, key, 0, func(ctx context.Context) error {
			held, ok := ownership.LeaseFromContext(ctx, key)
			require.True(t, ok)
			fence = held.Fence()
			return ownership.WithLock(ctx, l, key, 0, func(ctx context.Context) error {
				inner, _ := ownership.LeaseFromContext(ctx, key)
				require.Equal(t, fence, inner.Fence())
				return boom
			})
		})
		require.ErrorIs(t, err, boom)
		le, err := l.Acquire(ctx, key, 0)
		require.NoError(t, err, "WithLock must release on return")
		require.Greater(t, le.Fence(), fence)
		require.NoError(t, le.Release(ctx))
	})

	t.Run("WaitBudget", func(t *testing.T) {
		t.Parallel()
		const budget = 300 * time.Millisecond
		// The holder's lease is renewed all along: a waiter that ignored its
		// budget would wait until the test ends.
		l := newLocker(t, b, Options{Owner: "replica-holder", WaitTime: budget, WatchdogTimeout: 3 * time.Second})
		key := uniqueKey("budget")
		held, err := l.Acquire(ctx, key, 0)
		require.NoError(t, err)
		defer func() { _ = held.Release(ctx) }()

		start := time.Now()
		_, err = l.Acquire(ctx, key, 0)
		took := time.Since(start)
		require.ErrorIs(t, err, ownership.ErrAlreadyOwned)
		require.NotErrorIs(t, err, ownership.ErrUnavailable)
		var ae *ownership.AcquireError
		require.ErrorAs(t, err, &ae)
		require.Equal(t, ownership.CodeLockAcquisitionFailed, ae.Code)
		require.Equal(t, key, ae.Key)
		require.Equal(t, ownership.ReasonAlreadyOwned, ae.Reason)
		require.Equal(t, "replica-holder", ae.Owner)
		require.GreaterOrEqual(t, took, budget)
		require.Less(t, took, budget+2*time.Second, "wait budget overrun")

		// With a long budget, a ctx deadline or a cancellation ends the wait,
		// and is the cause.
		patient := newLocker(t, b, Options{Owner: "replica-holder", WaitTime: time.Minute, WatchdogTimeout: 3 * time.Second})
		pkey := uniqueKey("budget-ctx")
		pheld, err := patient.Acquire(ctx, pkey, 0)
		require.NoError(t, err)
		defer func() { _ = pheld.Release(ctx) }()
		dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		start = time.Now()
		_, err = patient.Acquire(dctx, pkey, 0)
		took = time.Since(start)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorAs(t, err, &ae)
		require.Equal(t, pkey, ae.Key)
		require.GreaterOrEqual(t, took, 100*time.Millisecond)
		require.Less(t, took, 10*time.Second, "the ctx deadline, not the 1m budget, must end the wait")

		cctx, cancel2 := context.WithCancel(ctx)
		time.AfterFunc(50*time.Millisecond, cancel2)
		start = time.Now()
		_, err = patient.Acquire(cctx, pkey, 0)
		require.ErrorIs(t, err, context.Canceled)
		require.Less(t, time.Since(start), 10*time.Second, "the cancellation, not the 1m budget, must end the wait")
	})

	t.Run("WakeOnRelease", func(t *testing.T) {
		t.Parallel()
		// A 30s TTL: a waiter that wakes within seconds of the release woke
		// on it, not on the TTL fallback.
		l := newLocker(t, b, Options{WaitTime: time.Minute, WatchdogTimeout: 30 * time.Second})
		key := uniqueKey("wake")
		held, err := l.Acquire(ctx, key, 0)
		require.NoError(t, err)
		got := make(chan ownership.Lease, 1)
		errc := make(chan error, 1)
		go func() {
			le, err := l.Acquire(ctx, key, 0)
			if err != nil {
				errc <- err
				return
			}
			got <- le
		}()
		start := time.Now()
		time.AfterFunc(100*time.Millisecond, func() { _ = held.Release(ctx) })
		select {
		case le := <-got:
			took := time.Since(start)
			require.GreaterOrEqual(t, took, 100*time.Millisecond, "acquired while the lock was held")
			require.Less(t, took, 10*time.Second, "woke by TTL, not by the release")
			require.Greater(t, le.Fence(), held.Fence())
			require.NoError(t, le.Release(ctx))
		case err := <-errc:
			t.Fatal(err)
		case <-time.After(20 * time.Second):
			t.Fatal("waiter never acquired")
		}
	})

	t.Run("WakeOnReleaseAcrossLockers", func(t *testing.T) {
		if !b.Shared {
			t.Skip("Lockers of this backend do not share locks")
		}
		t.Parallel()
		a := newLocker(t, b, Options{Owner: "replica-a", WaitTime: time.Minute, WatchdogTimeout: 30 * time.Second})
		c := newLocker(t, b, Options{Owner: "replica-c", WaitTime: time.Minute, WatchdogTimeout: 30 * time.Second})
		key := uniqueKey("wake2")
		held, err := a.Acquire(ctx, key, 0)
		require.NoError(t, err)
		got := make(chan error, 1)
		go func() {
			le, err := c.Acquire(ctx, key, 0)
			if err == nil {
				err = le.Release(ctx)
			}
			got <- err
		}()
		start := time.Now()
		time.AfterFunc(200*time.Millisecond, func() { _ = held.Release(ctx) })
		select {
		case err := <-got:
			require.NoError(t, err)
			took := time.Since(start)
			require.GreaterOrEqual(t, took, 200*time.Millisecond, "acquired while the lock was held")
			require.Less(t, took, 10*time.Second, "woke by TTL, not by the release message")
		case <-time.After(20 * time.Second):
			t.Fatal("waiter never acquired")
		}
	})

	t.Run("ExplicitLeaseExpires", func(t *testing.T) {
		t.Parallel()
		const lease = 400 * time.Millisecond
		l := newLocker(t, b, Options{WaitTime: 2 * time.Second})
		key := uniqueKey("explicit")
		start := time.Now()
		le, err := l.Acquire(ctx, key, lease)
		require.NoError(t, err)
		waitClosed(t, le.Done(), lease+5*time.Second, "explicit lease Done")
		took := time.Since(start)
		require.GreaterOrEqual(t, took, lease-ownership.SafetyMargin(lease)-5*time.Millisecond, "Done closed too early")
		require.Less(t, took, lease+2*time.Second, "Done closed late")
		require.ErrorIs(t, le.Err(), ownership.ErrLeaseLost)
		require.ErrorIs(t, le.Context().Err(), context.Canceled)
		require.ErrorIs(t, le.Release(ctx), ownership.ErrNotHeld)

		next, err := l.Acquire(ctx, key, 0)
		require.NoError(t, err, "the expired lease must not block the key")
		require.GreaterOrEqual(t, time.Since(start), lease-5*time.Millisecond, "acquired before the lease ran out")
		require.Greater(t, next.Fence(), le.Fence())
		require.NoError(t, next.Release(ctx))
	})

	t.Run("WatchdogSurvives", func(t *testing.T) {
		t.Parallel()
		// A 3s TTL renewed every 1s: a lease is lost only if its renewals
		// stall for almost 2s, which a busy machine does not do.
		const ttl = 3 * time.Second
		m := ownership.NewMetrics(nil)
		l := newLocker(t, b, Options{WaitTime: 10 * time.Millisecond, WatchdogTimeout: ttl, Metrics: m})
		key := uniqueKey("watchdog")
		start := time.Now()
		le, err := l.Acquire(ctx, key, 0)
		require.NoError(t, err)
		// Three renewals: the lease outlives its first TTL.
		require.Eventually(t, func() bool { return renewals(m, ownership.RenewalOK) >= 3 }, 30*time.Second, 20*time.Millisecond,
			"three renewals (lease: %v)", le.Err())
		require.GreaterOrEqual(t, time.Since(start), ttl-ownership.SafetyMargin(ttl), "three renewals take a TTL")
		require.NoError(t, le.Err(), "watchdog lease lost")
		require.False(t, isClosed(le.Done()))
		_, err = l.Acquire(ctx, key, 0)
		require.ErrorIs(t, err, ownership.ErrAlreadyOwned, "the renewed lock must still exclude")
		require.NoError(t, le.Release(ctx))
		require.ErrorIs(t, le.Err(), ownership.ErrReleased)
	})

	t.Run("DeletedBehindBack", func(t *testing.T) {
		t.Parallel()
		// A 3s TTL: the renewal (every 1s) finds the lock gone long before
		// the trust deadline (2.85s after the last renewal) would end it.
		const ttl = 3 * time.Second
		m := ownership.NewMetrics(nil)
		l := newLocker(t, b, Options{WaitTime: time.Second, WatchdogTimeout: ttl, Metrics: m})
		key := uniqueKey("deleted")
		le, err := l.Acquire(ctx, key, 0)
		require.NoError(t, err)
		b.DeleteLock(t, l, key)
		waitClosed(t, le.Done(), ttl+5*time.Second, "Done after the lock was deleted")
		require.ErrorIs(t, le.Err(), ownership.ErrLeaseLost)
		require.Error(t, le.Context().Err())
		// A Locker may count the round after ending the leases it found gone:
		// wait for the count. A lease the trust deadline ended is never
		// counted gone (it is not renewed again).
		require.Eventually(t, func() bool { return renewals(m, ownership.RenewalGone) == 1 }, 5*time.Second, 5*time.Millisecond,
			"the renewal, not the trust deadline, must end the lease")

		next, err := l.Acquire(ctx, key, 0)
		require.NoError(t, err)
		require.Greater(t, next.Fence(), le.Fence())
		require.ErrorIs(t, le.Release(ctx), ownership.ErrNotHeld)
		require.NoError(t, next.Err(), "a stale Release must not touch the new owner's lease")
		_, err = l.Acquire(ctx, key, 0)
		require.ErrorIs(t, err, ownership.ErrAlreadyOwned, "the new owner's lock must be intact")
		require.NoError(t, next.Release(ctx))
	})

	t.Run("ExplicitDeletedReleaseNotHeld", func(t *testing.T) {
		t.Parallel()
		l := newLocker(t, b, Options{WaitTime: time.Second})
		key := uniqueKey("explicit-deleted")
		le, err := l.Acquire(ctx, key, 5*time.Second)
		require.NoError(t, err)
		b.DeleteLock(t, l, key)
		other, err := l.Acquire(ctx, key, 5*time.Second)
		require.NoError(t, err)
		require.ErrorIs(t, le.Release(ctx), ownership.ErrNotHeld)
		require.ErrorIs(t, le.Err(), ownership.ErrLeaseLost)
		require.NoError(t, other.Err())
		_, err = l.Acquire(ctx, key, 0)
		require.ErrorIs(t, err, ownership.ErrAlreadyOwned)
		require.NoError(t, other.Release(ctx))
	})

	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()
		l := b.NewUnreachable(t, Options{Owner: "replica-a", WaitTime: 2 * time.Second, WatchdogTimeout: 600 * time.Millisecond})
		t.Cleanup(func() { _ = l.Close() })
		key := uniqueKey("unreachable")
		start := time.Now()
		ran := false
		err := ownership.WithLock(ctx, l, key, 0, func(context.Context) error { ran = true; return nil })
		require.False(t, ran, "the critical section ran without the lock")
		require.ErrorIs(t, err, ownership.ErrUnavailable)
		require.NotErrorIs(t, err, ownership.ErrAlreadyOwned)
		var ae *ownership.AcquireError
		require.ErrorAs(t, err, &ae)
		require.Equal(t, ownership.CodeLockAcquisitionFailed, ae.Code)
		require.Equal(t, key, ae.Key)
		require.Equal(t, ownership.ReasonUnavailable, ae.Reason)
		require.Error(t, ae.Err, "the cause must be kept")
		require.Less(t, time.Since(start), 2*time.Second+2*time.Second, "fail closed within the wait budget")

		_, err = l.Acquire(ctx, "bad key{", 0)
		require.ErrorIs(t, err, ownership.ErrInvalidKey, "a bad key is an error before any backend call")
	})

	t.Run("InvalidKey", func(t *testing.T) {
		t.Parallel()
		l := newLocker(t, b, Options{})
		for _, k := range []string{"", "has space", "br{ace}", strings.Repeat("k", ownership.MaxKeyLength+1)} {
			_, err := l.Acquire(ctx, k, 0)
			require.ErrorIs(t, err, ownership.ErrInvalidKey, "key %q", k)
		}
		_, err := l.Acquire(ctx, "ok", -time.Second)
		require.Error(t, err)
	})

	t.Run("InspectorAndClose", func(t *testing.T) {
		t.Parallel()
		l := b.New(t, Options{Owner: "replica-i", WaitTime: time.Second, WatchdogTimeout: 3 * time.Second})
		key := uniqueKey("inspect")
		le, err := l.Acquire(ctx, key, 0)
		require.NoError(t, err)
		if insp, ok := l.(ownership.Inspector); ok {
			info := findLock(t, insp, key)
			require.Equal(t, "replica-i", info.Owner)
			require.Equal(t, le.Fence(), info.Fence)
			require.EqualValues(t, 1, info.Holds)
			require.Positive(t, info.TTL)
			require.LessOrEqual(t, info.TTL, 3*time.Second)
		}
		require.NoError(t, l.Close())
		waitClosed(t, le.Done(), 5*time.Second, "Done after Close")
		require.ErrorIs(t, le.Err(), ownership.ErrLeaseLost)
		require.NoError(t, l.Close(), "Close twice")
		_, err = l.Acquire(ctx, key, 0)
		require.ErrorIs(t, err, ownership.ErrUnavailable, "Acquire after Close fails closed")
	})
}

func findLock(t *testing.T, insp ownership.Inspector, key string) ownership.LockInfo {
	t.Helper()
	locks, err := insp.Locks(context.Background())
	require.NoError(t, err)
	for _, li := range locks {
		if li.Key == key {
			return li
		}
	}
	t.Fatalf("lock %q not listed by Locks (%d listed)", key, len(locks))
	return ownership.LockInfo{}
}
