package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// Ending a term: a release, a lost lease, and deleting a lock by its token
// when its holder cannot say what became of it.

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
