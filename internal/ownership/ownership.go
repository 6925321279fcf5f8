package ownership

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Locker hands out ownership leases on keys. Implementations: the in-memory
// Locker in this package and the Redis adapter in redislock. Both pass the
// conformance suite in ownershiptest.
type Locker interface {
	// Acquire takes the lock on key. lease == 0 means watchdog-managed (the
	// lock lives for the watchdog timeout and is renewed every third of it
	// while the process lives); lease > 0 is an explicit lease that
	// hard-expires with no renewal. Waiting is bounded by the Locker's wait
	// time and by ctx.
	//
	// If ctx already carries a live lease on key taken from this Locker, the
	// hold count is incremented and a reentrant Lease is returned (its
	// Release decrements the count).
	//
	// Errors are *AcquireError (match with errors.Is against ErrAlreadyOwned
	// or ErrUnavailable) or ErrInvalidKey.
	Acquire(ctx context.Context, key string, lease time.Duration) (Lease, error)

	// Owner is the replica id this Locker writes into the locks it takes.
	Owner() string

	// Close releases nothing on its own: it stops background work (renewal,
	// subscriptions) after losing every lease still held, so their holders
	// learn of it through Done.
	Close() error
}

// WaitLocker is a Locker that also takes the wait per call: a caller that
// asks again after a failed Acquire (coordinator lock, within its --wait)
// waits only for what is left of its budget. Both Lockers implement it.
type WaitLocker interface {
	Locker
	// AcquireWithin is Acquire waiting at most wait (0: one try) instead
	// of the Locker's wait time.
	AcquireWithin(ctx context.Context, key string, lease, wait time.Duration) (Lease, error)
}

// Inspector lists the locks that currently exist (for `coordinator locks`
// and GET /v1/locks).
type Inspector interface {
	Locks(ctx context.Context) ([]LockInfo, error)
}

// LockInfo describes one held lock as the backend sees it.
type LockInfo struct {
	Key   string        `json:"key"`
	Owner string        `json:"owner"`
	Fence int64         `json:"fence"`
	Holds int64         `json:"holds"`
	TTL   time.Duration `json:"ttl_ns"`
	// Waiters is how many Lockers (replicas) wait in the key's queue for
	// their turn, as the backend counts them (a waiter that died stays
	// counted until its ticket lapses, a few seconds).
	Waiters int64 `json:"waiters"`
}

// Lease is one held ownership of a key.
type Lease interface {
	Key() string
	// Owner is the replica id of the holder.
	Owner() string
	// Fence is strictly increasing per key across acquisitions (reentrant
	// holds share the outer fence). Pass it to every fenced write.
	Fence() int64
	// Done is closed when the lease ends: released, lost (renewal found the
	// lock gone, renewals failed up to the local trust deadline), or an
	// explicit lease reached its end.
	Done() <-chan struct{}
	// Context is cancelled when Done closes. It carries the lease, so an
	// Acquire of the same key under it is reentrant.
	Context() context.Context
	// Err is nil while the lease is held; afterwards ErrLeaseLost or
	// ErrReleased says how it ended.
	Err() error
	// Release gives up this hold. The last hold deletes the lock (compare-
	// and-delete by owner) and stops renewal at once. Releasing a lease that
	// is no longer held returns an error matching ErrNotHeld and never
	// touches another owner's lock.
	Release(ctx context.Context) error
}

// CodeLockAcquisitionFailed is the error code ADR-024 decision 7 names
// (docs/adr/024-distributed-lock-strategy.md).
const CodeLockAcquisitionFailed = "LOCK_ACQUISITION_FAILED"

// Defaults every Locker takes for a zero wait time and watchdog timeout
// (COORDINATOR_LOCK_WAIT_TIME, COORDINATOR_LOCK_WATCHDOG_TIMEOUT).
const (
	DefaultWaitTime        = 5 * time.Second
	DefaultWatchdogTimeout = 30 * time.Second
)

// Reason says why an acquisition failed.
type Reason string

const (
	ReasonAlreadyOwned Reason = "already_owned"
	ReasonUnavailable  Reason = "unavailable"
)

var (
	// ErrAlreadyOwned matches an *AcquireError whose Reason is already_owned.
	ErrAlreadyOwned = errors.New("ownership: already owned")
	// ErrUnavailable matches an *AcquireError whose Reason is unavailable.
	ErrUnavailable = errors.New("ownership: lock backend unavailable")
	// ErrLeaseLost: the lease ended without the holder releasing it.
	ErrLeaseLost = errors.New("ownership: lease lost")
	// ErrReleased: the lease ended because the holder released it.
	ErrReleased = errors.New("ownership: lease released")
	// ErrNotHeld: Release of a lease that is no longer held.
	ErrNotHeld = errors.New("ownership: lease not held")
	// ErrInvalidKey: the key breaks the rules of ValidateKey.
	ErrInvalidKey = errors.New("ownership: invalid key")
)

// AcquireError is the fail-closed error of Acquire: the critical section must
// not run. It carries ADR-024's code, the contended key, the current owner
// when known, and the cause (a backend error, or ctx.Err()).
type AcquireError struct {
	Code   string
	Key    string
	Owner  string
	Reason Reason
	Err    error
}

func (e *AcquireError) Error() string {
	msg := fmt.Sprintf("ownership: %s: %s for %q", e.Code, e.Reason, e.Key)
	if e.Owner != "" {
		msg += fmt.Sprintf(" (owner %s)", e.Owner)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *AcquireError) Unwrap() error { return e.Err }

func (e *AcquireError) Is(target error) bool {
	switch target {
	case ErrAlreadyOwned:
		return e.Reason == ReasonAlreadyOwned
	case ErrUnavailable:
		return e.Reason == ReasonUnavailable
	}
	return false
}

// AlreadyOwned builds the error for a contended key.
func AlreadyOwned(key, owner string, cause error) *AcquireError {
	return &AcquireError{Code: CodeLockAcquisitionFailed, Key: key, Owner: owner, Reason: ReasonAlreadyOwned, Err: cause}
}

// Unavailable builds the error for an unreachable backend.
func Unavailable(key string, cause error) *AcquireError {
	return &AcquireError{Code: CodeLockAcquisitionFailed, Key: key, Reason: ReasonUnavailable, Err: cause}
}

// MaxKeyLength bounds a key; Redis keys add the prefix and a suffix.
const MaxKeyLength = 200

// ValidateKey accepts 1..MaxKeyLength characters from [A-Za-z0-9._:/-].
// Braces are excluded because the Redis adapter wraps the key in a cluster
// hash tag; whitespace and control characters are excluded so keys print
// cleanly in logs and events.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLength {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidKey, len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '/' || c == '-'
		if !ok {
			return fmt.Errorf("%w: %q has character %q at %d (allowed: A-Z a-z 0-9 . _ : / -)", ErrInvalidKey, key, c, i)
		}
	}
	return nil
}

type leaseCtxKey struct{ key string }

// ContextWithLease returns ctx carrying l, so that Acquire(ctx, l.Key(), ...)
// is reentrant. Lease.Context already does this; adapters use it.
func ContextWithLease(ctx context.Context, l Lease) context.Context {
	return context.WithValue(ctx, leaseCtxKey{l.Key()}, l)
}

// LeaseFromContext returns the lease on key that ctx carries, if any.
func LeaseFromContext(ctx context.Context, key string) (Lease, bool) {
	l, ok := ctx.Value(leaseCtxKey{key}).(Lease)
	return l, ok
}

// ReleaseTimeout bounds a release done on the way out (shutdown, WithLock's
// return). TTL expiry is the backstop if it does not finish.
const ReleaseTimeout = 5 * time.Second

// WithLock runs fn while holding key. fn gets the lease's context, which is
// cancelled if the lease is lost; fn must stop at its next checkpoint. The
// lease is released when fn returns, even if ctx was cancelled. If the lease
// was lost while fn ran, the returned error matches ErrLeaseLost (joined with
// fn's own error, if any).
func WithLock(ctx context.Context, l Locker, key string, lease time.Duration, fn func(ctx context.Context) error) error {
	held, err := l.Acquire(ctx, key, lease)
	if err != nil {
		return err
	}
	// fn also stops when the caller's ctx is cancelled (shutdown), not only
	// when the lease is lost.
	fnCtx, cancelFn := context.WithCancelCause(held.Context())
	stop := context.AfterFunc(ctx, func() { cancelFn(context.Cause(ctx)) })
	fnErr := fn(fnCtx)
	stop()
	cancelFn(nil)
	if lostErr := held.Err(); errors.Is(lostErr, ErrLeaseLost) {
		return errors.Join(lostErr, fnErr)
	}
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeout)
	defer cancel()
	if relErr := held.Release(relCtx); relErr != nil {
		return errors.Join(fnErr, fmt.Errorf("ownership: release %q: %w", key, relErr))
	}
	return fnErr
}
