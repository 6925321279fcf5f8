package ownership

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"
)

// MemoryConfig configures NewMemoryLocker.
type MemoryConfig struct {
	// Owner is the replica id written into every lock. Required.
	Owner string
	// WaitTime bounds how long Acquire blocks on a held key. Default 5s.
	WaitTime time.Duration
	// WatchdogTimeout is the TTL of watchdog-managed leases; they are
	// renewed every third of it. Default 30s.
	WatchdogTimeout time.Duration
	// Metrics receives the coordinator_lock_* series. Default none.
	Metrics *Metrics
}

// MemoryLocker is a Locker whose locks live in this process only. It has
// the Redis adapter's semantics (watchdog renewal, explicit leases, trust
// deadlines, fences, reentrancy, bounded waiting) and passes the same
// conformance suite. It gives no exclusion across processes: it serves unit
// tests and single-replica mode (COORDINATOR_LOCK_ENABLED=false).
//
// SetUnavailable and DeleteLock inject faults for tests.
type MemoryLocker struct {
	cfg MemoryConfig

	mu          sync.Mutex
	locks       map[string]*memLock
	fences      map[string]int64
	released    map[string]chan struct{} // closed (and dropped) when the key's lock goes
	live        map[*Term]*memTerm
	watchdogs   int
	unavailable bool
	closed      bool
	looping     bool
	seq         uint64

	kick      chan struct{}
	stop      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

type memLock struct {
	token, owner string
	fence, holds int64
	expires      time.Time
	term         *Term
}

type memTerm struct {
	ttl   time.Duration
	timer *time.Timer // fires at the local trust deadline
}

var (
	errMemoryUnavailable = errors.New("ownership: memory locker set unavailable")
	errClosed            = errors.New("ownership: locker closed")
)

// NewMemoryLocker returns an in-process Locker. It panics if cfg.Owner is
// empty (a programming error).
func NewMemoryLocker(cfg MemoryConfig) *MemoryLocker {
	if cfg.Owner == "" {
		panic("ownership: MemoryConfig.Owner is required")
	}
	cfg.WaitTime = cmp.Or(cfg.WaitTime, DefaultWaitTime)
	cfg.WatchdogTimeout = cmp.Or(cfg.WatchdogTimeout, DefaultWatchdogTimeout)
	return &MemoryLocker{
		cfg:      cfg,
		locks:    map[string]*memLock{},
		fences:   map[string]int64{},
		released: map[string]chan struct{}{},
		live:     map[*Term]*memTerm{},
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
	}
}

// Owner returns the replica id.
func (l *MemoryLocker) Owner() string { return l.cfg.Owner }

// Acquire implements Locker.
func (l *MemoryLocker) Acquire(ctx context.Context, key string, lease time.Duration) (Lease, error) {
	return l.AcquireWithin(ctx, key, lease, l.cfg.WaitTime)
}

// AcquireWithin implements WaitLocker.
func (l *MemoryLocker) AcquireWithin(ctx context.Context, key string, lease, wait time.Duration) (Lease, error) {
	start := time.Now()
	le, err := l.acquire(ctx, key, lease, start, wait)
	if !errors.Is(err, ErrInvalidKey) {
		outcome := AcquireOutcome(err)
		if err == nil {
			if t, _ := TermOf(le); t.Holds() > 1 {
				outcome = OutcomeReentered
			}
		}
		l.cfg.Metrics.Acquire(outcome, time.Since(start))
	}
	return le, err
}

func (l *MemoryLocker) acquire(ctx context.Context, key string, lease time.Duration, start time.Time, wait time.Duration) (Lease, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	if lease < 0 {
		return nil, fmt.Errorf("%w: negative lease %s for %q", ErrInvalidKey, lease, key)
	}
	if t, ok := ReentrantTerm(ctx, key, l.owns); ok {
		return l.reenter(t)
	}
	if err := ctx.Err(); err != nil {
		return nil, Unavailable(key, err)
	}
	deadline := start.Add(wait)
	for {
		now := time.Now()
		l.mu.Lock()
		switch {
		case l.closed:
			l.mu.Unlock()
			return nil, Unavailable(key, errClosed)
		case l.unavailable:
			l.mu.Unlock()
			return nil, Unavailable(key, errMemoryUnavailable)
		}
		cur := l.locks[key]
		if cur != nil && !now.Before(cur.expires) {
			l.dropLocked(key)
			cur = nil
		}
		if cur == nil {
			le := l.grantLocked(ctx, key, lease, now)
			l.mu.Unlock()
			return le, nil
		}
		owner, ttl := cur.owner, cur.expires.Sub(now)
		wake := l.releasedLocked(key)
		l.mu.Unlock()

		remaining := deadline.Sub(now)
		if remaining <= 0 {
			return nil, AlreadyOwned(key, owner, nil)
		}
		timer := time.NewTimer(min(ttl, remaining))
		select {
		case <-wake:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, AlreadyOwned(key, owner, ctx.Err())
		}
		timer.Stop()
	}
}

func (l *MemoryLocker) owns(t *Term) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.live[t]
	return ok
}

func (l *MemoryLocker) reenter(t *Term) (Lease, error) {
	l.mu.Lock()
	if l.unavailable {
		l.mu.Unlock()
		return nil, Unavailable(t.key, errMemoryUnavailable)
	}
	cur := l.locks[t.key]
	if cur != nil && cur.term == t && time.Now().Before(cur.expires) {
		cur.holds++
		l.mu.Unlock()
		return t.Hold(), nil
	}
	owner := ""
	if cur != nil {
		owner = cur.owner
	}
	l.mu.Unlock()
	t.End(ErrLeaseLost)
	return nil, AlreadyOwned(t.key, owner, ErrLeaseLost)
}

// grantLocked creates the lock and its term. l.mu is held.
func (l *MemoryLocker) grantLocked(ctx context.Context, key string, lease time.Duration, now time.Time) Lease {
	// The fence is max(last + 1, wall clock in µs), as in Redis: a Locker of
	// a restarted process still hands out fences above the last run's.
	l.fences[key] = max(l.fences[key]+1, time.Now().UnixMicro())
	l.seq++
	ttl := cmp.Or(lease, l.cfg.WatchdogTimeout)
	t := NewTerm(TermConfig{
		Key: key, Owner: l.cfg.Owner, Token: l.cfg.Owner + ":" + strconv.FormatUint(l.seq, 10),
		Fence: l.fences[key], Watchdog: lease == 0, Acquired: now, Parent: ctx,
		Release: l.release, OnEnd: l.ended,
	})
	l.locks[key] = &memLock{token: t.token, owner: l.cfg.Owner, fence: t.fence, holds: 1, expires: now.Add(ttl), term: t}
	mt := &memTerm{ttl: ttl}
	mt.timer = time.AfterFunc(time.Until(TrustDeadline(now, ttl)), func() { t.End(ErrLeaseLost) })
	l.live[t] = mt
	if t.watchdog {
		l.watchdogs++
		if !l.looping {
			l.looping = true
			l.wg.Add(1)
			go l.renewLoop()
		}
	}
	l.cfg.Metrics.Held()
	return t.Hold()
}

// releasedLocked returns the channel closed when key's lock goes.
func (l *MemoryLocker) releasedLocked(key string) chan struct{} {
	ch, ok := l.released[key]
	if !ok {
		ch = make(chan struct{})
		l.released[key] = ch
	}
	return ch
}

// dropLocked deletes key's lock and wakes its waiters. l.mu is held.
func (l *MemoryLocker) dropLocked(key string) {
	delete(l.locks, key)
	if ch, ok := l.released[key]; ok {
		close(ch)
		delete(l.released, key)
	}
}

func (l *MemoryLocker) release(_ context.Context, t *Term) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unavailable {
		return errMemoryUnavailable
	}
	cur := l.locks[t.key]
	if cur == nil || cur.token != t.token || cur.fence != t.fence || !time.Now().Before(cur.expires) {
		return fmt.Errorf("%w: %q fence %d", ErrNotHeld, t.key, t.fence)
	}
	cur.holds--
	if cur.holds <= 0 {
		l.dropLocked(t.key)
	}
	return nil
}

func (l *MemoryLocker) ended(t *Term, err error) {
	l.mu.Lock()
	mt, ok := l.live[t]
	if ok {
		delete(l.live, t)
		mt.timer.Stop()
		if t.watchdog {
			l.watchdogs--
		}
	}
	last := l.watchdogs == 0
	l.mu.Unlock()
	if !ok {
		return
	}
	if t.watchdog && last {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
	l.cfg.Metrics.Ended(time.Since(t.acquired), errors.Is(err, ErrLeaseLost))
}

// renewLoop renews every watchdog lease each third of the watchdog timeout.
// It runs only while watchdog leases are held.
func (l *MemoryLocker) renewLoop() {
	defer l.wg.Done()
	tick := time.NewTicker(l.cfg.WatchdogTimeout / 3)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.kick:
		case <-tick.C:
			l.renewAll()
		}
		l.mu.Lock()
		if l.watchdogs == 0 || l.closed {
			l.looping = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
	}
}

func (l *MemoryLocker) renewAll() {
	var lost []*Term
	ok := 0
	l.mu.Lock()
	if l.unavailable {
		n := l.watchdogs
		l.mu.Unlock()
		l.cfg.Metrics.Renewals(RenewalError, n)
		return
	}
	now := time.Now()
	for t, mt := range l.live {
		if !t.watchdog {
			continue
		}
		cur := l.locks[t.key]
		if cur == nil || cur.token != t.token || cur.fence != t.fence || !now.Before(cur.expires) {
			lost = append(lost, t)
			continue
		}
		cur.expires = now.Add(mt.ttl)
		mt.timer.Reset(time.Until(TrustDeadline(now, mt.ttl)))
		ok++
	}
	l.mu.Unlock()
	l.cfg.Metrics.Renewals(RenewalOK, ok)
	l.cfg.Metrics.Renewals(RenewalGone, len(lost))
	for _, t := range lost {
		t.End(ErrLeaseLost)
	}
}

// Close loses every lease still held (their Done closes) and stops the
// renewal goroutine. Acquire fails with ErrUnavailable afterwards. Safe to
// call twice; it waits.
func (l *MemoryLocker) Close() error {
	l.mu.Lock()
	l.closed = true
	terms := make([]*Term, 0, len(l.live))
	for t := range l.live {
		terms = append(terms, t)
	}
	l.mu.Unlock()
	for _, t := range terms {
		t.End(ErrLeaseLost)
	}
	l.closeOnce.Do(func() { close(l.stop) })
	l.wg.Wait()
	return nil
}

// Locks implements Inspector: the unexpired locks, sorted by key.
func (l *MemoryLocker) Locks(context.Context) ([]LockInfo, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unavailable {
		return nil, errMemoryUnavailable
	}
	now := time.Now()
	out := make([]LockInfo, 0, len(l.locks))
	for k, c := range l.locks {
		if now.Before(c.expires) {
			out = append(out, LockInfo{Key: k, Owner: c.owner, Fence: c.fence, Holds: c.holds, TTL: c.expires.Sub(now)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// SetUnavailable makes the backend unreachable (true) or reachable again:
// acquisitions fail with ErrUnavailable and renewals fail, so watchdog
// leases are lost at their trust deadline. For fault-injection tests.
func (l *MemoryLocker) SetUnavailable(down bool) {
	l.mu.Lock()
	l.unavailable = down
	l.mu.Unlock()
}

// DeleteLock deletes key's lock behind its holder's back, as an operator's
// DEL would in Redis. The holder learns of it at its next renewal (watchdog
// leases) or its Release (explicit leases). For fault-injection tests.
func (l *MemoryLocker) DeleteLock(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.locks[key]; ok {
		l.dropLocked(key)
	}
}

var (
	_ WaitLocker = (*MemoryLocker)(nil)
	_ Inspector  = (*MemoryLocker)(nil)
)
