package redislock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// Acquiring: the wait for a lock, the acquire script's answer, and an
// acquisition answered too late to trust.

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
