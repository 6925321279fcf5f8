// Package redislock is the Redis adapter of the ownership port: ADR-024's
// (docs/adr/024-distributed-lock-strategy.md) DistributedLock on go-redis v9 (single, sentinel or cluster). See the
// ownership package documentation for the semantics and docs/lock.md for
// what the lock promises; scripts.go says how Redis stores it. Config.Layout
// chooses that layout or the redisson one (layout.go, scripts_redisson.go,
// redisson_wake.go), in which the lock of key K is Redisson's RLock named K.
package redislock

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// Config configures New. Defaults are filled by New.
type Config struct {
	// Prefix starts every Redis key. Default "coordinator". No braces or
	// whitespace; glob characters are matched literally.
	Prefix string
	// Owner is the replica id written into every lock. Required.
	Owner string
	// WaitTime bounds how long Acquire blocks on a held key. Default 5s.
	WaitTime time.Duration
	// WatchdogTimeout is the TTL of watchdog-managed leases, renewed every
	// third of it. Default 30s; at least 30ms.
	WatchdogTimeout time.Duration
	// WaitReplicas is how many replicas must acknowledge (Redis WAIT) an
	// acquisition or a renewal before it counts: ReplicasAuto (0, the
	// default) waits for the replicas the master reports online, ReplicasNone
	// (-1) never waits, N > 0 waits for N. See docs/lock.md.
	WaitReplicas int
	// ReplicaTimeout bounds each WAIT. Default 200ms.
	ReplicaTimeout time.Duration
	// MinTrust is how long an acquisition must still be trusted for when
	// its reply arrives. One that comes back later (Redis stalled, the
	// reply was slow) is given back at once, deleted by its token, and the
	// wait goes on within WaitTime. Default 0: only an acquisition already
	// past its trust deadline is given back. A holder that needs time to
	// stop its work before the deadline (coordinator lock: the grace and
	// the kill margin) sets that.
	MinTrust time.Duration
	// Logger receives lease losses and renewal trouble. Default: discard.
	Logger *slog.Logger
	// Metrics receives the coordinator_lock_* series. Default none.
	Metrics *ownership.Metrics
	// Layout is how locks are laid out in Redis: LayoutCoordinator (the
	// default) or LayoutRedisson (the lock of key K is Redisson's RLock
	// named K; docs/lock.md "Mixed fleets with Redisson").
	Layout Layout
}

// WaitReplicas values besides a count.
const (
	ReplicasAuto = 0
	ReplicasNone = -1
)

func (c *Config) defaults() {
	c.Prefix = cmp.Or(c.Prefix, DefaultPrefix)
	c.WaitTime = cmp.Or(c.WaitTime, ownership.DefaultWaitTime)
	c.WatchdogTimeout = cmp.Or(c.WatchdogTimeout, ownership.DefaultWatchdogTimeout)
	c.ReplicaTimeout = cmp.Or(c.ReplicaTimeout, DefaultReplicaTimeout)
	c.Layout = cmp.Or(c.Layout, LayoutCoordinator)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c Config) validate() error {
	switch {
	case c.Owner == "":
		return errors.New("redislock: Config.Owner is required")
	case strings.ContainsAny(c.Prefix, "{} \t\r\n"):
		return fmt.Errorf("redislock: Config.Prefix %q must not contain braces or whitespace", c.Prefix)
	case c.WaitTime < 0:
		return fmt.Errorf("redislock: Config.WaitTime %s is negative", c.WaitTime)
	case c.WatchdogTimeout < 30*time.Millisecond:
		return fmt.Errorf("redislock: Config.WatchdogTimeout %s is below 30ms", c.WatchdogTimeout)
	case c.WaitReplicas < ReplicasNone:
		return fmt.Errorf("redislock: Config.WaitReplicas %d: must be -1 (none), 0 (auto) or a count", c.WaitReplicas)
	case c.MinTrust < 0:
		return fmt.Errorf("redislock: Config.MinTrust %s is negative", c.MinTrust)
	case c.ReplicaTimeout < 0 || c.ReplicaTimeout >= DefaultReadTimeout:
		return fmt.Errorf("redislock: Config.ReplicaTimeout %s: must be positive and below the read timeout %s", c.ReplicaTimeout, DefaultReadTimeout)
	case c.Layout != LayoutCoordinator && c.Layout != LayoutRedisson:
		return fmt.Errorf("redislock: Config.Layout %q: must be %q or %q", c.Layout, LayoutCoordinator, LayoutRedisson)
	case c.Layout == LayoutRedisson && strings.HasPrefix(c.Owner, RedissonOwnerPrefix):
		// The owner a waiter sees tells a Redisson holder from a replica.
		return fmt.Errorf("redislock: Config.Owner %q: must not start with %q in the redisson layout", c.Owner, RedissonOwnerPrefix)
	}
	return nil
}

// Locker is the Redis ownership.Locker. One Locker per process is the
// intended use: it keeps one pub/sub subscription for all waiters and one
// renewal goroutine for all watchdog leases.
type Locker struct {
	client  redis.UniversalClient
	cluster bool // client is a *redis.ClusterClient
	cfg     Config
	log     *slog.Logger
	m       *ownership.Metrics

	// id names this Locker in the wait queues and in its wake channel; every
	// token starts with it.
	id       string
	tokenSeq atomic.Uint64

	// live: every term this Locker holds; the watchdog ones are renewed.
	mu        sync.Mutex
	live      map[*ownership.Term]*termState
	watchdogs int
	looping   bool
	closed    bool
	bgClosed  bool // no new background work (Close is waiting for it)

	// round is held (a token in it) while a renewal batch is in flight, so
	// that a release can wait out a batch that may still carry its term:
	// after Release, no renewal of it reaches Redis. A channel, so that the
	// wait honours the release's context.
	round chan struct{}

	// waiters by key; the head of each queue is the only one that asks Redis.
	wmu    sync.Mutex
	queues map[string]*queue

	srv   serverState
	redir redirects
	// batchers queue the calls per target while its pipelines are busy
	// (coalesce.go).
	direct   batcher // calls through the client itself
	bmu      sync.Mutex
	batchers map[string]*batcher // calls through a node's client, by "node <addr>"
	flushes  sync.WaitGroup      // the goroutines sending queued calls

	pubsub *redis.PubSub
	// rsubs: the Redisson unlock channels this Locker listens on while it
	// waits for their keys (redisson layout; redisson_wake.go).
	rmu   sync.Mutex
	rsubs map[string]*rsub
	// poll bounds how long a waiting head sleeps before it asks Redis again
	// (ticketRefresh; tests lengthen it to show a wake-up arrived).
	poll      time.Duration
	runCtx    context.Context // cancelled by Close
	cancelRun context.CancelFunc
	stop      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

type termState struct {
	lockKey string
	slot    uint16
	ttl     time.Duration
	timer   *time.Timer // fires at the local trust deadline
	// deadline is the local trust deadline the timer is set to (l.mu).
	deadline time.Time
	// renewing: a watchdog term the renewal loop still renews (l.mu).
	renewing bool
	// seq numbers the term's hold-count updates, so a late resend of an
	// older one cannot overwrite a newer one (l.mu).
	seq int64
}

// New returns a Locker on client and subscribes to its wake channel
// (<prefix>:wake:<Locker id>). Nothing else is contacted: an unreachable
// Redis shows up as ErrUnavailable from Acquire, and the subscription
// reconnects on its own. Close it when done; it does not close client.
func New(client redis.UniversalClient, cfg Config) (*Locker, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	l := &Locker{
		client: client,
		cfg:    cfg,
		log:    cfg.Logger,
		m:      cfg.Metrics,
		id:     cfg.Owner + ":" + hex.EncodeToString(rnd[:]),
		live:   map[*ownership.Term]*termState{},
		queues: map[string]*queue{},
		round:  make(chan struct{}, 1),
		stop:   make(chan struct{}),
		rsubs:  map[string]*rsub{},
		poll:   ticketRefresh,
	}
	_, l.cluster = client.(*redis.ClusterClient)
	l.runCtx, l.cancelRun = context.WithCancel(context.Background())
	runCtx := l.runCtx
	l.pubsub = client.Subscribe(runCtx)
	if err := l.pubsub.Subscribe(runCtx, l.wakeChannel()); err != nil {
		// Remembered anyway: the subscription is made on reconnect.
		l.log.Warn("lock_subscribe_failed", "error", err)
	}
	l.wg.Add(1)
	go l.listen(runCtx)
	return l, nil
}

// Owner returns the replica id.
func (l *Locker) Owner() string { return l.cfg.Owner }

// Timing of the hand-off between waiting Lockers.
const (
	// handoffMS is how long a released lock stays reserved for the oldest
	// waiting Locker: long enough for the wake message to reach it and its
	// acquire to come back on a busy machine, short enough that a waiter
	// that died costs little.
	handoffMS = 25
	// ticketRefresh: a waiting head asks Redis again at least this often,
	// which renews its queue ticket (and notices a reservation whose owner
	// died). Tickets last ticketTTL, so a live waiter's never lapses and a
	// dead one's is dropped within ticketTTL.
	ticketRefresh = time.Second
	ticketTTL     = 3 * ticketRefresh
	queueMS       = int64(ticketTTL/time.Millisecond) + 1000
	// endedMS keeps the marker of a released term long enough for any
	// resend of its release (go-redis: read + write timeout per try, one
	// retry) to find it.
	endedMS = 10_000
	// cleanupTimeout bounds a best-effort delete by token.
	cleanupTimeout = 2*DefaultReadTimeout + time.Second
)

var errClosed = errors.New("redislock: locker closed")

// Acquire implements ownership.Locker.
func (l *Locker) Acquire(ctx context.Context, key string, lease time.Duration) (ownership.Lease, error) {
	return l.AcquireWithin(ctx, key, lease, l.cfg.WaitTime)
}

// AcquireWithin implements ownership.WaitLocker: Acquire with a wait of
// its own (0: one try).
func (l *Locker) AcquireWithin(ctx context.Context, key string, lease, wait time.Duration) (ownership.Lease, error) {
	start := time.Now()
	le, err := l.acquire(ctx, key, lease, start, max(wait, 0))
	if !errors.Is(err, ownership.ErrInvalidKey) {
		outcome := ownership.AcquireOutcome(err)
		if err == nil {
			if t, _ := ownership.TermOf(le); t.Holds() > 1 {
				outcome = ownership.OutcomeReentered
			}
		}
		l.m.Acquire(outcome, time.Since(start))
	}
	return le, err
}

func (l *Locker) acquire(ctx context.Context, key string, lease time.Duration, start time.Time, wait time.Duration) (ownership.Lease, error) {
	if err := ownership.ValidateKey(key); err != nil {
		return nil, err
	}
	if lease < 0 {
		return nil, fmt.Errorf("%w: negative lease %s for %q", ownership.ErrInvalidKey, lease, key)
	}
	if t, ok := ownership.ReentrantTerm(ctx, key, l.owns); ok {
		return l.reenter(ctx, t)
	}
	if err := ctx.Err(); err != nil {
		return nil, ownership.Unavailable(key, err)
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return nil, ownership.Unavailable(key, errClosed)
	}
	if err := l.usable(ctx); err != nil {
		return nil, ownership.Unavailable(key, err)
	}

	ttl := cmp.Or(lease, l.cfg.WatchdogTimeout)
	if l.cfg.MinTrust > 0 && l.cfg.MinTrust >= ttl-ownership.SafetyMargin(ttl) {
		return nil, fmt.Errorf("%w: a lease of %s for %q is never trusted for Config.MinTrust %s", ownership.ErrInvalidKey, ttl, key, l.cfg.MinTrust)
	}
	deadline := start.Add(wait)
	token := l.newToken()
	ttlMS := max(ttl.Milliseconds(), 1)

	w, q := l.enqueue(key)
	defer l.dequeue(key, w, q)
	owner := ""
	answered := false // Redis has said at least once that the lock is held
	var late error    // the last acquisition came back too late to trust
	watching := false
	asked, lastTry := false, false
	for {
		if w.attempt(&l.wmu) || lastTry {
			asked = true
			if cerr := ctx.Err(); cerr != nil && answered {
				// The caller gave up while the timer or a wake also fired
				// (select picks either): nothing is sent, and the answer is
				// what the wait learned, as in the ctx.Done case below.
				return nil, ownership.AlreadyOwned(key, cmp.Or(owner, q.lastOwner(&l.wmu)), cerr)
			}
			// A last try out of turn may find this Locker queued by the
			// head: '+' lets an acquisition take the entry out.
			res, err := l.runAcquire(ctx, deadline, key, token, ttlMS, q.isQueued(&l.wmu) || lastTry)
			if err != nil {
				// The script may have run (only its reply was lost, or ctx
				// ended while it was in flight): delete what it wrote.
				l.cleanupAfter(err, key, token)
				if cerr := ctx.Err(); cerr != nil {
					err = fmt.Errorf("%w: %w", cerr, err)
				}
				return nil, ownership.Unavailable(key, err)
			}
			switch {
			case res.acquired && l.tooLate(res.sent, ttl):
				// Trusted for too short a time, or not at all: give it back
				// and ask again at once, with a new token (a resend of this
				// acquisition still in flight finds no lock of its token).
				q.setQueued(&l.wmu, false)
				late = l.giveBack(key, token, res.fence, res.sent)
				token = l.newToken()
				w.fallback = 0
			case res.acquired:
				q.setQueued(&l.wmu, false)
				le := l.grant(ctx, key, token, res.fence, lease == 0, ttl, res.sent)
				w.acquired(&l.wmu, ttl)
				return le, nil
			default:
				late = nil
				answered = true
				q.setQueued(&l.wmu, res.queued)
				if res.owner != "" {
					owner = res.owner
					q.seen(&l.wmu, owner)
				}
				w.fallback = min(time.Duration(res.pttl)*time.Millisecond, l.poll)
				if !watching {
					// A holder's release may come from a Redisson client: listen
					// to its unlock channel from now on (redisson layout).
					watching = true
					if stop := l.watchRedisson(key); stop != nil {
						defer stop()
					}
				}
				switch {
				case res.pttl == -2: // just vanished
					w.fallback = time.Millisecond
				case res.pttl < 0:
					// No TTL: never set by us, and in the redisson layout a
					// name holding a hash that is no lock (a Redisson RMap).
					// It ends by a delete, not by itself: wait for a wake-up
					// or the poll, not a millisecond (a waiter asked ~800
					// times a second).
					w.fallback = l.poll
				case res.reserved != "":
					// Reserved for another waiting Locker, which takes it within a
					// round trip; ask again once the reservation would have
					// lapsed, in case that Locker died.
					w.fallback = time.Duration(res.pttl+1) * time.Millisecond
				}
			}
		}
		remaining := time.Until(deadline)
		switch {
		case remaining <= 0 && late != nil:
			return nil, ownership.Unavailable(key, late)
		case remaining <= 0 && !asked && cmp.Or(owner, q.lastOwner(&l.wmu)) == "":
			// Waited behind another caller of this process whose ask is
			// still unanswered: nobody here knows whether, or by whom, the
			// lock is held. One try of its own, as a zero wait gets, so
			// that already_owned names the owner.
			lastTry = true
			continue
		case remaining <= 0:
			return nil, ownership.AlreadyOwned(key, cmp.Or(owner, q.lastOwner(&l.wmu)), nil)
		}
		timer := time.NewTimer(min(w.fallback, remaining))
		select {
		case <-w.wake:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, ownership.AlreadyOwned(key, cmp.Or(owner, q.lastOwner(&l.wmu)), ctx.Err())
		case <-l.stop:
			timer.Stop()
			return nil, ownership.Unavailable(key, errClosed)
		}
		timer.Stop()
	}
}

type acquireResult struct {
	acquired bool
	fence    int64
	sent     time.Time // when the send that acquired was made
	pttl     int64
	owner    string
	reserved string
	queued   bool
}

// runAcquire runs the acquire script once (and WAIT, where replicas must
// acknowledge), bounded by the wait budget (at least one dial timeout, so a
// zero budget still gets its one try).
func (l *Locker) runAcquire(ctx context.Context, deadline time.Time, key, token string, ttlMS int64, queued bool) (acquireResult, error) {
	callCtx, cancel := context.WithDeadline(ctx, later(deadline, time.Now().Add(DefaultDialTimeout)))
	defer cancel()
	// A ticket outlives the wait by a little, never by more than ticketTTL.
	ticket := min(time.Until(deadline)+100*time.Millisecond, ticketTTL).Milliseconds()
	if ticket <= 0 {
		ticket = 0
	}
	queue, tickets := l.queueKeys(key)
	keys := []string{l.lockKey(key), l.fenceKey(key), queue, tickets}
	// The ticket, with a leading '+' when this Locker may have a queue entry.
	t := strconv.FormatInt(ticket, 10)
	if queued {
		t = "+" + t
	}
	c := l.acquireCall(keys, token, ttlMS, t)
	l.do(callCtx, c)
	if c.err != nil {
		return acquireResult{}, c.err
	}
	cmd := c.cmd
	if f, ok := cmd.Val().(string); ok {
		fence, err := fenceOf(f)
		if err != nil {
			return acquireResult{}, err
		}
		if c.acked != nil {
			return acquireResult{}, c.acked // the caller deletes the unreplicated lock
		}
		return acquireResult{acquired: true, fence: fence, sent: c.sent}, nil
	}
	vals, err := cmd.Slice()
	if err != nil {
		return acquireResult{}, err
	}
	if len(vals) < 2 {
		return acquireResult{}, fmt.Errorf("redislock: acquire script returned %v", vals)
	}
	n, _ := vals[1].(int64)
	r := acquireResult{pttl: n, queued: ticket > 0}
	if len(vals) > 3 {
		r.owner, _ = vals[2].(string)
		r.reserved, _ = vals[3].(string)
	}
	return r, nil
}

// fenceOf reads the fence an acquire returned (a decimal string).
func fenceOf(f string) (int64, error) {
	n, err := strconv.ParseInt(f, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("redislock: acquire script returned fence %q", f)
	}
	return n, nil
}

// ErrAcquiredTooLate: the acquisition's reply came back with less than
// Config.MinTrust left before its trust deadline (or past it), every time
// until the wait ran out; each was given back.
var ErrAcquiredTooLate = errors.New("redislock: acquisition answered too late to trust")

func (l *Locker) newToken() string {
	return l.id + ":" + strconv.FormatUint(l.tokenSeq.Add(1), 36)
}

// tooLate reports whether an acquisition sent at sent, answered now, leaves
// less than MinTrust before its trust deadline.
func (l *Locker) tooLate(sent time.Time, ttl time.Duration) bool {
	return !time.Now().Add(l.cfg.MinTrust).Before(ownership.TrustDeadline(sent, ttl))
}

// giveBack deletes the lock an acquisition that came back too late wrote,
// by its token, before the wait goes on; in the background if Redis does
// not answer now (its TTL is the backstop). It returns the error the wait
// ends with if it runs out meanwhile.
func (l *Locker) giveBack(key, token string, fence int64, sent time.Time) error {
	took := time.Since(sent)
	l.log.Warn("lock_acquired_too_late", "lock_key", key, "fence", fence, "reply_ms", took.Milliseconds(),
		"min_trust_ms", l.cfg.MinTrust.Milliseconds(), "detail", "given back; waiting on")
	ctx, cancel := context.WithTimeout(l.runCtx, cleanupTimeout)
	defer cancel()
	if _, err := l.runRelease(ctx, key, token, 0); err != nil {
		l.cleanupAfter(err, key, token)
	}
	return fmt.Errorf("%w: fence %d answered after %s", ErrAcquiredTooLate, fence, took.Round(time.Millisecond))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (l *Locker) owns(t *ownership.Term) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.live[t]
	return ok
}

// nextSeq numbers a hold-count update of t (0 when t is no longer live).
func (l *Locker) nextSeq(t *ownership.Term) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	st, ok := l.live[t]
	if !ok {
		return 0
	}
	st.seq++
	return st.seq
}

// setHolds tells Redis how many holds t has now. ok is false when the term
// no longer holds the lock; owner is then the current holder's replica.
func (l *Locker) setHolds(ctx context.Context, t *ownership.Term, holds int64) (ok bool, owner string, err error) {
	c := newCall(holdsScript, false, []string{l.lockKey(t.Key())}, t.Token(), t.Fence(), holds, l.nextSeq(t))
	l.do(ctx, c)
	if c.err != nil {
		return false, "", c.err
	}
	vals, err := c.cmd.Slice()
	if err != nil {
		return false, "", err
	}
	if len(vals) < 2 {
		return false, "", fmt.Errorf("redislock: holds script returned %v", vals)
	}
	flag, _ := vals[0].(int64)
	owner, _ = vals[1].(string)
	return flag == 1, owner, nil
}

func (l *Locker) reenter(ctx context.Context, t *ownership.Term) (ownership.Lease, error) {
	callCtx, cancel := context.WithTimeout(ctx, max(l.cfg.WaitTime, DefaultDialTimeout))
	defer cancel()
	ok, owner, err := l.setHolds(callCtx, t, t.Holds()+1)
	if err != nil {
		return nil, ownership.Unavailable(t.Key(), err)
	}
	if ok {
		return t.Hold(), nil
	}
	if t.Holds() == 0 {
		// Another goroutine released the last hold meanwhile, and its
		// delete came first: the lease ended released, not lost.
		return nil, ownership.AlreadyOwned(t.Key(), owner, ownership.ErrReleased)
	}
	l.lose(t, "reentry found the lock gone", false)
	return nil, ownership.AlreadyOwned(t.Key(), owner, ownership.ErrLeaseLost)
}

// grant registers a fresh term: its trust-deadline timer and, for a
// watchdog lease, its place in the renewal loop.
func (l *Locker) grant(ctx context.Context, key, token string, fence int64, watchdog bool, ttl time.Duration, sent time.Time) ownership.Lease {
	t := ownership.NewTerm(ownership.TermConfig{
		Key: key, Owner: l.cfg.Owner, Token: token, Fence: fence, Watchdog: watchdog,
		Acquired: sent, Parent: ctx, Release: l.release, OnEnd: l.ended,
	})
	st := &termState{lockKey: l.lockKey(key), ttl: ttl, deadline: ownership.TrustDeadline(sent, ttl)}
	st.slot = slot(st.lockKey)
	st.timer = time.AfterFunc(time.Until(st.deadline), func() {
		reason := "explicit lease reached its end"
		if watchdog {
			reason = "no successful renewal before the trust deadline"
		}
		l.lose(t, reason, true)
	})
	lease := t.Hold()
	l.mu.Lock()
	closed := l.closed
	if !closed {
		st.renewing = watchdog
		l.live[t] = st
		if watchdog {
			l.watchdogs++
			if !l.looping {
				l.looping = true
				l.wg.Add(1)
				go l.renewLoop()
			}
		}
	}
	l.mu.Unlock()
	l.m.Held()
	if closed {
		// Acquired while the Locker closed: nobody will hold it.
		l.lose(t, "locker closed", true)
	}
	return lease
}

// TrustDeadline is when this Locker stops trusting lease: the time the
// acquire or the last renewal that counted (acknowledged by the required
// replicas) was sent, plus the TTL, less the safety margin. A holder that
// must stop work before the lease can end times its stop by it. ok is
// false when lease is not a live lease of this Locker.
func (l *Locker) TrustDeadline(lease ownership.Lease) (deadline time.Time, ok bool) {
	t, ok := ownership.TermOf(lease)
	if !ok {
		return time.Time{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st, ok := l.live[t]
	if !ok {
		return time.Time{}, false
	}
	return st.deadline, true
}

// lose ends t as lost. With cleanup, the lock may still exist in Redis
// (renewals or a resent acquire may have landed after their replies were
// lost) and nobody holds it any more: it is deleted by its token once the
// holder has had its safety margin to stop, best effort.
func (l *Locker) lose(t *ownership.Term, reason string, cleanup bool) {
	l.mu.Lock()
	var ttl time.Duration
	if st, ok := l.live[t]; ok {
		ttl = st.ttl
	}
	l.mu.Unlock()
	if t.End(ownership.ErrLeaseLost) {
		l.log.Warn("lease_lost", "lock_key", t.Key(), "owner", l.cfg.Owner, "fence", t.Fence(), "reason", reason)
		if cleanup {
			l.cleanup(t.Key(), t.Token(), ownership.SafetyMargin(ttl))
		}
	}
}

// ended is the terms' OnEnd: it stops the trust timer and renewal at once,
// and lets the next waiter of this process ask Redis.
func (l *Locker) ended(t *ownership.Term, err error) {
	l.mu.Lock()
	st, ok := l.live[t]
	if ok {
		delete(l.live, t)
		if st.renewing {
			l.watchdogs--
		}
	}
	l.mu.Unlock()
	if st != nil {
		st.timer.Stop()
	}
	l.m.Ended(time.Since(t.Acquired()), errors.Is(err, ownership.ErrLeaseLost))
	l.wakeLocal(t.Key())
}

// release is the terms' Release: one hold less. A hold that is not the last
// sets the count; the last one ends the term in Redis (compare-and-delete by
// token and fence) and hands the lock to the oldest waiting Locker.
func (l *Locker) release(ctx context.Context, t *ownership.Term) error {
	if holds := t.Holds(); holds > 0 {
		ok, _, err := l.setHolds(ctx, t, holds)
		switch {
		case err != nil:
			return fmt.Errorf("%w: %w", ownership.ErrUnavailable, err)
		case !ok:
			return fmt.Errorf("%w: %q fence %d is no longer this holder's", ownership.ErrNotHeld, t.Key(), t.Fence())
		}
		return nil
	}
	if t.Watchdog() {
		// The last hold: take the term out of renewal before the delete, and
		// wait out a renewal batch that may already carry it (as long as ctx
		// allows: a renewal that lands later finds no lock to extend).
		l.mu.Lock()
		if st, ok := l.live[t]; ok && st.renewing {
			st.renewing = false
			l.watchdogs--
		}
		l.mu.Unlock()
		select {
		case l.round <- struct{}{}:
			<-l.round
		case <-ctx.Done():
		}
	}
	ended, err := l.runRelease(ctx, t.Key(), t.Token(), t.Fence())
	if err != nil {
		// It may have run; if not, nobody holds the lock now: delete it.
		l.cleanupAfter(err, t.Key(), t.Token())
		return fmt.Errorf("%w: %w", ownership.ErrUnavailable, err)
	}
	if !ended {
		return fmt.Errorf("%w: %q fence %d is no longer this holder's", ownership.ErrNotHeld, t.Key(), t.Fence())
	}
	return nil
}

// runRelease runs the release script for token's term of key (fence 0: any
// term of token, no ended marker). ended reports that this call or an
// earlier send of it ended the term.
func (l *Locker) runRelease(ctx context.Context, key, token string, fence int64) (ended bool, err error) {
	queue, tickets := l.queueKeys(key)
	f := ""
	if fence != 0 {
		f = strconv.FormatInt(fence, 10)
	}
	c := l.releaseCall(key, []string{l.lockKey(key), queue, tickets, l.endedKey(key, fence)}, token, f)
	l.do(ctx, c)
	if c.err != nil {
		return false, c.err
	}
	res := c.cmd.Val()
	switch r := res.(type) {
	case int64:
		return r == 1, nil
	case string: // ended, and handed off to the Locker r
		return true, nil
	}
	return false, fmt.Errorf("redislock: release script returned %v", res)
}

// cleanup deletes token's lock on key after delay, best effort, in the
// background: the lock nobody holds any more (a failed acquire or release,
// a lost lease) is not left for a whole TTL.
func (l *Locker) cleanup(key, token string, delay time.Duration) {
	l.background(func() {
		if delay > 0 {
			// Not cut short by Close: the margin is the holder's time to stop.
			time.Sleep(delay)
		}
		l.deleteByToken(key, token)
	})
}

// cleanupAfter is cleanup(key, token, 0) for a call of token's that failed
// with err. Where err says a pipeline still carries the call (its caller's
// context ended first), the delete waits for the pipeline's answer: sent
// before it, it could otherwise run first and leave the lock behind.
func (l *Locker) cleanupAfter(err error, key, token string) {
	answered := sentAndLeft(err)
	if answered == nil {
		l.cleanup(key, token, 0)
		return
	}
	l.background(func() {
		<-answered // the go-redis timeouts bound the pipeline
		l.deleteByToken(key, token)
	})
}

func (l *Locker) deleteByToken(key, token string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if _, err := l.runRelease(ctx, key, token, 0); err != nil {
		l.log.Debug("lock_cleanup_failed", "lock_key", key, "error", err)
	}
}

// background runs fn in a goroutine Close waits for; after Close, fn is
// dropped (all of it is best effort) and background reports false.
func (l *Locker) background(fn func()) bool {
	l.mu.Lock()
	if l.bgClosed {
		l.mu.Unlock()
		return false
	}
	l.wg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		fn()
	}()
	return true
}

// Close loses every lease still held (their Done closes; the locks in Redis
// are not deleted and expire on their own), stops the renewal loop and the
// subscription, waits for them and for pending best-effort clean-ups. Safe
// to call twice. It does not close the client.
func (l *Locker) Close() error {
	l.mu.Lock()
	l.closed = true
	terms := make([]*ownership.Term, 0, len(l.live))
	for t := range l.live {
		terms = append(terms, t)
	}
	l.mu.Unlock()
	for _, t := range terms {
		// Not deleted: a caller may keep a lock past its process on purpose
		// (the reaper's minimum hold); the TTL ends it.
		l.lose(t, "locker closed", false)
	}
	l.closeOnce.Do(func() {
		close(l.stop)
		l.cancelRun()
		_ = l.pubsub.Close()
	})
	l.mu.Lock()
	l.bgClosed = true
	l.mu.Unlock()
	l.closeRedissonSubs()
	l.wg.Wait()
	l.flushes.Wait()
	l.closeRedirects()
	return nil
}

// Ping checks that Redis answers (readiness).
func (l *Locker) Ping(ctx context.Context) error {
	if cc, ok := l.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
	}
	return l.client.Ping(ctx).Err()
}

var (
	_ ownership.WaitLocker = (*Locker)(nil)
	_ ownership.Inspector  = (*Locker)(nil)
)
