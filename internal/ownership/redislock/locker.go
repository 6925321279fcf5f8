// Package redislock is the Redis adapter of the ownership port: ADR-024's
// DistributedLock on go-redis v9 (single, sentinel or cluster). See the
// ownership package documentation for the semantics; this file's comments
// say how Redis gives them.
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
	// Prefix starts every Redis key. Default "coordinator".
	Prefix string
	// Owner is the replica id written into every lock. Required.
	Owner string
	// WaitTime bounds how long Acquire blocks on a held key. Default 5s.
	WaitTime time.Duration
	// WatchdogTimeout is the TTL of watchdog-managed leases, renewed every
	// third of it. Default 30s; at least 30ms.
	WatchdogTimeout time.Duration
	// Logger receives lease losses and renewal trouble. Default: discard.
	Logger *slog.Logger
	// Metrics receives the coordinator_lock_* series. Default none.
	Metrics *ownership.Metrics
}

func (c *Config) defaults() {
	c.Prefix = cmp.Or(c.Prefix, "coordinator")
	c.WaitTime = cmp.Or(c.WaitTime, 5*time.Second)
	c.WatchdogTimeout = cmp.Or(c.WatchdogTimeout, 30*time.Second)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c Config) validate() error {
	switch {
	case c.Owner == "":
		return errors.New("redislock: Config.Owner is required")
	case strings.ContainsAny(c.Prefix, "{} \t\n"):
		return fmt.Errorf("redislock: Config.Prefix %q must not contain braces or whitespace", c.Prefix)
	case c.WaitTime < 0:
		return fmt.Errorf("redislock: Config.WaitTime %s is negative", c.WaitTime)
	case c.WatchdogTimeout < 30*time.Millisecond:
		return fmt.Errorf("redislock: Config.WatchdogTimeout %s is below 30ms", c.WatchdogTimeout)
	}
	return nil
}

// Locker is the Redis ownership.Locker. One Locker per process is the
// intended use: it keeps one pub/sub subscription for all waiters and one
// renewal goroutine for all watchdog leases.
type Locker struct {
	client redis.UniversalClient
	cfg    Config
	log    *slog.Logger
	m      *ownership.Metrics

	tokenBase string
	tokenSeq  atomic.Uint64

	// live: every term this Locker holds; the watchdog ones are renewed.
	mu        sync.Mutex
	live      map[*ownership.Term]*termState
	watchdogs int
	looping   bool
	closed    bool

	// roundMu is held while a renewal batch is in flight, so that a release
	// can wait out a batch that may still carry its term: after Release,
	// no renewal of it reaches Redis.
	roundMu sync.Mutex

	// waiters by key; the head of each queue is the only one that asks Redis.
	wmu    sync.Mutex
	queues map[string]*queue

	pubsub    *redis.PubSub
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
	// renewing: a watchdog term the renewal loop still renews (l.mu).
	renewing bool
}

// New returns a Locker on client and starts its one pattern subscription
// (<prefix>:{*}:released). Nothing else is contacted: an unreachable Redis
// shows up as ErrUnavailable from Acquire, and the subscription reconnects
// on its own. Close it when done; it does not close client.
func New(client redis.UniversalClient, cfg Config) (*Locker, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	l := &Locker{
		client:    client,
		cfg:       cfg,
		log:       cfg.Logger,
		m:         cfg.Metrics,
		tokenBase: cfg.Owner + ":" + hex.EncodeToString(rnd[:]) + ":",
		live:      map[*ownership.Term]*termState{},
		queues:    map[string]*queue{},
		stop:      make(chan struct{}),
	}
	l.runCtx, l.cancelRun = context.WithCancel(context.Background())
	runCtx := l.runCtx
	l.pubsub = client.PSubscribe(runCtx)
	if err := l.pubsub.PSubscribe(runCtx, l.cfg.Prefix+":{*}:released"); err != nil {
		// Remembered anyway: the subscription is made on reconnect.
		l.log.Warn("lock_subscribe_failed", "error", err)
	}
	l.wg.Add(1)
	go l.listen(runCtx)
	return l, nil
}

// Owner returns the replica id.
func (l *Locker) Owner() string { return l.cfg.Owner }

func (l *Locker) lockKey(key string) string { return l.cfg.Prefix + ":{" + key + "}:lock" }
func (l *Locker) fenceKey(key string) string {
	return l.cfg.Prefix + ":{" + key + "}:fence"
}
func (l *Locker) channel(key string) string { return l.cfg.Prefix + ":{" + key + "}:released" }

// handoffMS is how long a released lock stays reserved for the Locker that
// waited for it first: long enough for the release message to reach it and
// its acquire to come back (a few round trips), short enough that a dead
// waiter costs little.
const handoffMS = 10

// keyOf is the inverse of lockKey/channel: the key between the prefix's
// "{" and the last "}".
func (l *Locker) keyOf(name string) (string, bool) {
	p := l.cfg.Prefix + ":{"
	if !strings.HasPrefix(name, p) {
		return "", false
	}
	rest := name[len(p):]
	i := strings.LastIndexByte(rest, '}')
	if i <= 0 {
		return "", false
	}
	return rest[:i], true
}

var errClosed = errors.New("redislock: locker closed")

// Acquire implements ownership.Locker.
func (l *Locker) Acquire(ctx context.Context, key string, lease time.Duration) (ownership.Lease, error) {
	start := time.Now()
	le, err := l.acquire(ctx, key, lease, start)
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

func (l *Locker) acquire(ctx context.Context, key string, lease time.Duration, start time.Time) (ownership.Lease, error) {
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

	ttl := cmp.Or(lease, l.cfg.WatchdogTimeout)
	deadline := start.Add(l.cfg.WaitTime)
	token := l.tokenBase + strconv.FormatUint(l.tokenSeq.Add(1), 36)
	keys := []string{l.lockKey(key), l.fenceKey(key)}
	ttlMS := max(ttl.Milliseconds(), 1)

	w, q := l.enqueue(key)
	defer l.dequeue(key, w, q)
	owner := ""
	for {
		if w.attempt(q, &l.wmu) {
			sent := time.Now()
			res, err := l.runAcquire(ctx, deadline, keys, token, ttlMS)
			if err != nil {
				if ctx.Err() != nil {
					return nil, ownership.AlreadyOwned(key, owner, ctx.Err())
				}
				return nil, ownership.Unavailable(key, err)
			}
			if res.acquired {
				le := l.grant(ctx, key, token, res.fence, lease == 0, ttl, sent)
				w.acquired(q, &l.wmu, ttl)
				return le, nil
			}
			if res.owner != "" {
				owner = res.owner
				q.seen(&l.wmu, owner)
			}
			w.fallback = time.Duration(res.pttl) * time.Millisecond
			switch {
			case res.pttl < 0: // no TTL (never set by us) or just vanished
				w.fallback = time.Millisecond
			case res.owner == "":
				// Reserved for another Locker's waiter, which takes it within a
				// round trip; ask again soon, to queue behind that term (the
				// retry marks it as waited for, so its release wakes us).
				w.fallback = min(w.fallback, time.Millisecond)
			}
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
			return nil, ownership.AlreadyOwned(key, cmp.Or(owner, q.lastOwner(&l.wmu)), nil)
		}
		timer := time.NewTimer(min(w.fallback, remaining))
		select {
		case <-w.wake:
		case <-timer.C:
			w.timedOut = true
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
	pttl     int64
	owner    string
}

// runAcquire runs the acquire script, bounded by the wait budget (at least
// one dial timeout, so a zero budget still gets its one try).
func (l *Locker) runAcquire(ctx context.Context, deadline time.Time, keys []string, token string, ttlMS int64) (acquireResult, error) {
	callCtx, cancel := context.WithDeadline(ctx, later(deadline, time.Now().Add(DefaultDialTimeout)))
	defer cancel()
	vals, err := acquireScript.Run(callCtx, l.client, keys, token, l.cfg.Owner, ttlMS, l.tokenBase).Slice()
	if err != nil {
		return acquireResult{}, err
	}
	if len(vals) < 2 {
		return acquireResult{}, fmt.Errorf("redislock: acquire script returned %v", vals)
	}
	flag, _ := vals[0].(int64)
	n, _ := vals[1].(int64)
	if flag == 1 {
		return acquireResult{acquired: true, fence: n}, nil
	}
	r := acquireResult{pttl: n}
	if len(vals) > 2 {
		r.owner, _ = vals[2].(string)
	}
	return r, nil
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

func (l *Locker) reenter(ctx context.Context, t *ownership.Term) (ownership.Lease, error) {
	callCtx, cancel := context.WithTimeout(ctx, max(l.cfg.WaitTime, DefaultDialTimeout))
	defer cancel()
	vals, err := reenterScript.Run(callCtx, l.client, []string{l.lockKey(t.Key())}, t.Token(), t.Fence()).Slice()
	if err != nil {
		return nil, ownership.Unavailable(t.Key(), err)
	}
	holds, _ := vals[0].(int64)
	if holds > 0 {
		return t.Hold(), nil
	}
	owner, _ := vals[1].(string)
	l.lose(t, "reentry found the lock gone")
	return nil, ownership.AlreadyOwned(t.Key(), owner, ownership.ErrLeaseLost)
}

// grant registers a fresh term: its trust-deadline timer and, for a
// watchdog lease, its place in the renewal loop.
func (l *Locker) grant(ctx context.Context, key, token string, fence int64, watchdog bool, ttl time.Duration, sent time.Time) ownership.Lease {
	t := ownership.NewTerm(ownership.TermConfig{
		Key: key, Owner: l.cfg.Owner, Token: token, Fence: fence, Watchdog: watchdog,
		Acquired: sent, Parent: ctx, Release: l.release, OnEnd: l.ended,
	})
	st := &termState{lockKey: l.lockKey(key), ttl: ttl}
	st.slot = slot(st.lockKey)
	st.timer = time.AfterFunc(time.Until(ownership.TrustDeadline(sent, ttl)), func() {
		reason := "explicit lease reached its end"
		if watchdog {
			reason = "no successful renewal before the trust deadline"
		}
		l.lose(t, reason)
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
		l.lose(t, "locker closed")
	}
	return lease
}

func (l *Locker) lose(t *ownership.Term, reason string) {
	if t.End(ownership.ErrLeaseLost) {
		l.log.Warn("lease_lost", "lock_key", t.Key(), "owner", l.cfg.Owner, "fence", t.Fence(), "reason", reason)
	}
}

// ended is the terms' OnEnd: it stops the trust timer and renewal at once.
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
}

// release is the terms' Release: one hold less, compare-and-delete by token
// and fence, PUBLISH on the last one.
func (l *Locker) release(ctx context.Context, t *ownership.Term) error {
	if t.Holds() == 0 && t.Watchdog() {
		// The last hold: take the term out of renewal before the delete, and
		// wait out a renewal batch that may already carry it.
		l.mu.Lock()
		if st, ok := l.live[t]; ok && st.renewing {
			st.renewing = false
			l.watchdogs--
		}
		l.mu.Unlock()
		l.roundMu.Lock()
		l.roundMu.Unlock() //nolint:staticcheck // an empty critical section: a barrier
	}
	n, err := releaseScript.Run(ctx, l.client, []string{l.lockKey(t.Key()), l.channel(t.Key())},
		t.Token(), t.Fence(), l.tokenBase, handoffMS).Int64()
	if err != nil {
		return fmt.Errorf("%w: %w", ownership.ErrUnavailable, err)
	}
	if n < 0 {
		return fmt.Errorf("%w: %q fence %d is no longer this holder's", ownership.ErrNotHeld, t.Key(), t.Fence())
	}
	if n == 0 {
		l.wakeLocal(t.Key(), t.Fence())
	}
	return nil
}

// Close loses every lease still held (their Done closes; the locks in Redis
// expire on their own), stops the renewal loop and the subscription, and
// waits for them. Safe to call twice. It does not close the client.
func (l *Locker) Close() error {
	l.mu.Lock()
	l.closed = true
	terms := make([]*ownership.Term, 0, len(l.live))
	for t := range l.live {
		terms = append(terms, t)
	}
	l.mu.Unlock()
	for _, t := range terms {
		l.lose(t, "locker closed")
	}
	l.closeOnce.Do(func() {
		close(l.stop)
		l.cancelRun()
		_ = l.pubsub.Close()
	})
	l.wg.Wait()
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
	_ ownership.Locker    = (*Locker)(nil)
	_ ownership.Inspector = (*Locker)(nil)
)
