package ownership

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Term is one acquisition of a key as a Locker tracks it locally: the owner
// token that is unique to it, the fence, the local hold count and how it
// ended. Reentrant holds share one Term. Adapters (the memory Locker here,
// redislock) build their Leases with NewTerm and Term.Hold, so every Locker
// has the same lease behaviour; callers only see the Lease interface.
type Term struct {
	key, owner, token string
	fence             int64
	watchdog          bool
	acquired          time.Time // monotonic

	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}

	holds   atomic.Int64
	release func(ctx context.Context, t *Term) error
	onEnd   func(t *Term, err error)

	endOnce sync.Once
	mu      sync.Mutex
	err     error
}

// TermConfig describes a fresh acquisition to NewTerm.
type TermConfig struct {
	Key, Owner, Token string
	Fence             int64
	// Watchdog is true for a watchdog-managed lease, false for an explicit one.
	Watchdog bool
	// Acquired is when the acquire request was sent (monotonic clock).
	Acquired time.Time
	// Parent gives the lease context its values (not its cancellation).
	Parent context.Context
	// Release gives up one hold in the backend. The last hold deletes the
	// lock. It returns an error matching ErrNotHeld when the backend no
	// longer has this term, or the backend's error.
	Release func(ctx context.Context, t *Term) error
	// OnEnd runs once when the term ends (stop renewal and timers, metrics);
	// err is ErrReleased or ErrLeaseLost (possibly wrapped).
	OnEnd func(t *Term, err error)
}

// NewTerm starts a term with one hold; get its first Lease with Hold.
func NewTerm(c TermConfig) *Term {
	parent := c.Parent
	if parent == nil {
		parent = context.Background()
	}
	t := &Term{
		key: c.Key, owner: c.Owner, token: c.Token, fence: c.Fence, watchdog: c.Watchdog,
		acquired: c.Acquired, done: make(chan struct{}), release: c.Release, onEnd: c.OnEnd,
	}
	if t.acquired.IsZero() {
		t.acquired = time.Now()
	}
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	t.cancel = cancel
	t.ctx = ctx
	return t
}

func (t *Term) Key() string                        { return t.key }
func (t *Term) Owner() string                      { return t.owner }
func (t *Term) Token() string                      { return t.token }
func (t *Term) Fence() int64                       { return t.fence }
func (t *Term) Watchdog() bool                     { return t.watchdog }
func (t *Term) Acquired() time.Time                { return t.acquired }
func (t *Term) Done() <-chan struct{}              { return t.done }
func (t *Term) Holds() int64                       { return t.holds.Load() }
func (t *Term) Ended() bool                        { return t.Err() != nil }
func (t *Term) String() string                     { return fmt.Sprintf("%s@%d", t.key, t.fence) }
func (t *Term) contextFor(l Lease) context.Context { return ContextWithLease(t.ctx, l) }

// Err is nil while the term is held, then ErrReleased or ErrLeaseLost.
func (t *Term) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// End ends the term once: records err, runs OnEnd, closes Done and cancels
// the lease context. It reports whether this call ended it.
func (t *Term) End(err error) bool {
	ended := false
	t.endOnce.Do(func() {
		ended = true
		t.mu.Lock()
		t.err = err
		t.mu.Unlock()
		if t.onEnd != nil {
			t.onEnd(t, err)
		}
		t.cancel(err) // before Done closes: whoever sees Done sees ctx.Err()
		close(t.done)
	})
	return ended
}

// Hold adds one hold and returns its Lease handle. Releasing the handle
// gives the hold up; the last one ends the term.
func (t *Term) Hold() Lease {
	t.holds.Add(1)
	h := &hold{t: t}
	h.ctx = t.contextFor(h)
	return h
}

// TermOf returns the Term behind a Lease built by Term.Hold.
func TermOf(l Lease) (*Term, bool) {
	h, ok := l.(*hold)
	if !ok {
		return nil, false
	}
	return h.t, true
}

// ReentrantTerm returns the live Term on key that ctx carries, if belongs
// says it was taken from the calling Locker.
func ReentrantTerm(ctx context.Context, key string, belongs func(*Term) bool) (*Term, bool) {
	l, ok := LeaseFromContext(ctx, key)
	if !ok {
		return nil, false
	}
	t, ok := TermOf(l)
	if !ok || t.Ended() || !belongs(t) {
		return nil, false
	}
	return t, true
}

type hold struct {
	t        *Term
	ctx      context.Context
	released atomic.Bool
}

func (h *hold) Key() string              { return h.t.key }
func (h *hold) Owner() string            { return h.t.owner }
func (h *hold) Fence() int64             { return h.t.fence }
func (h *hold) Done() <-chan struct{}    { return h.t.done }
func (h *hold) Context() context.Context { return h.ctx }
func (h *hold) Err() error               { return h.t.Err() }

func (h *hold) Release(ctx context.Context) error {
	if !h.released.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: %q already released", ErrNotHeld, h.t.key)
	}
	if err := h.t.Err(); err != nil {
		return fmt.Errorf("%w: %q: %w", ErrNotHeld, h.t.key, err)
	}
	last := h.t.holds.Add(-1) == 0
	err := h.t.release(ctx, h.t)
	switch {
	case errors.Is(err, ErrNotHeld) && !last && h.t.holds.Load() == 0:
		// Another goroutine released the term's last hold meanwhile, and
		// its delete reached the backend before this hold's count update:
		// this hold is given up all the same. The last release says what
		// became of the lock.
		return nil
	case errors.Is(err, ErrNotHeld):
		h.t.End(ErrLeaseLost)
		return fmt.Errorf("ownership: release %q: %w", h.t.key, err)
	case last:
		// The last hold stops renewal whatever the backend said; if the
		// delete did not reach it, the TTL is the backstop.
		h.t.End(ErrReleased)
	}
	if err != nil {
		return fmt.Errorf("ownership: release %q: %w", h.t.key, err)
	}
	return nil
}

// SafetyMargin is how much earlier than the backend's TTL a holder stops
// trusting its lease: TTL/20 + 2ms, for clock drift between the holder and
// Redis and for the holder to stop at its next checkpoint.
func SafetyMargin(ttl time.Duration) time.Duration {
	return ttl/20 + 2*time.Millisecond
}

// TrustDeadline is sent + ttl - SafetyMargin(ttl), where sent is when the
// acquire or renew request that set the TTL was sent (monotonic clock).
func TrustDeadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - SafetyMargin(ttl))
}
