// Package redislock is the Redis adapter of the ownership port: ADR-024's
// (docs/adr/024-distributed-lock-strategy.md) DistributedLock on go-redis v9 (single, sentinel or cluster). See the
// ownership package documentation for the semantics and docs/lock.md for
// what the lock promises; scripts.go says how Redis stores it. Config.Layout
// chooses that layout or the redisson one (layout.go, scripts_redisson.go,
// redisson_wake.go), in which the lock of key K is Redisson's RLock named K.
package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telco-platform/coordinator/internal/ownership"
)

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
	batchers map[string]*batcher // by "node <addr>" (a node's client) or "client <addr>" (a cluster's, per master)
	bclosed  bool                // bmu: new batchers start closed (Close)
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
	l.closeBatchers()
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
