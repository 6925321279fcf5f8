package redislock

import (
	"context"
	"errors"
	"net"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// renewBatch bounds the commands in one pipeline.
const renewBatch = 512

// renewLoop is the one watchdog goroutine of a Locker: every third of the
// watchdog timeout it renews all watchdog leases in pipelined batches. It
// runs while watchdog leases are held, and stops after a tick with none (or
// at Close).
func (l *Locker) renewLoop() {
	defer l.wg.Done()
	every := l.cfg.WatchdogTimeout / 3
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
			l.renewRound(every)
		}
		// Idle for a whole interval: stop (a new watchdog lease restarts
		// it). Not at once, so acquire/release pairs do not churn goroutines.
		l.mu.Lock()
		if l.watchdogs == 0 || l.closed {
			l.looping = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
	}
}

type renewItem struct {
	t  *ownership.Term
	st *termState
}

// renewRound renews every watchdog lease once. A lease whose lock is gone
// (or belongs to another term) is lost at once; one whose renewal fails,
// or is not acknowledged by the required replicas, keeps its trust
// deadline, and is lost when it passes.
func (l *Locker) renewRound(budget time.Duration) {
	l.mu.Lock()
	items := make([]renewItem, 0, l.watchdogs)
	for t, st := range l.live {
		if st.renewing {
			items = append(items, renewItem{t, st})
		}
	}
	l.mu.Unlock()
	if len(items) == 0 {
		return
	}
	// Grouped by cluster slot, so each pipeline touches few nodes.
	slices.SortFunc(items, func(a, b renewItem) int { return int(a.st.slot) - int(b.st.slot) })

	ctx, cancel := context.WithTimeout(l.runCtx, budget)
	defer cancel()
	var ok, gone, failed int
	var firstErr error
	for start := 0; start < len(items); start += renewBatch {
		batch := items[start:min(start+renewBatch, len(items))]
		results := l.renewBatch(ctx, batch)
		for i, it := range batch {
			r := results[i]
			switch {
			case r.skipped:
			case r.err != nil:
				failed++
				firstErr = cmpErr(firstErr, r.err)
			case r.held:
				ok++
				if it.t.Ended() {
					// Landed after the trust deadline (or a release that gave
					// up waiting for this batch): it extended a lock nobody
					// holds. Delete it, after the holder's margin to stop.
					l.cleanup(it.t.Key(), it.t.Token(), ownership.SafetyMargin(it.st.ttl))
				} else {
					d := ownership.TrustDeadline(r.sent, it.st.ttl)
					l.mu.Lock()
					it.st.deadline = d
					l.mu.Unlock()
					it.st.timer.Reset(time.Until(d))
				}
			default:
				gone++
				l.lose(it.t, "renewal found the lock gone", false)
			}
		}
	}
	l.m.Renewals(ownership.RenewalOK, ok)
	l.m.Renewals(ownership.RenewalGone, gone)
	l.m.Renewals(ownership.RenewalError, failed)
	if failed > 0 {
		l.log.Warn("lock_renewal_failed", "leases", failed, "error", firstErr)
	}
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

type renewResult struct {
	held, skipped bool
	err           error
	sent          time.Time
}

// renewBatch sends the renewals of a batch while holding the round token, so
// that a Release can wait for a batch that may carry its term. The send
// path pipelines them per master, each followed by WAIT where replicas must
// acknowledge them: a renewal counts only once they have. sent is, per
// renewal, when the send that counted was made.
func (l *Locker) renewBatch(ctx context.Context, batch []renewItem) []renewResult {
	results := make([]renewResult, len(batch))
	select {
	case l.round <- struct{}{}:
	case <-ctx.Done():
		for i := range results {
			results[i].err = ctx.Err()
		}
		return results
	}
	defer func() { <-l.round }()
	l.mu.Lock()
	for i, it := range batch {
		results[i].skipped = !it.st.renewing
	}
	l.mu.Unlock()

	calls := make([]*call, 0, len(batch))
	idx := make([]int, 0, len(batch))
	for i, it := range batch {
		if results[i].skipped {
			continue
		}
		ttl := max(it.st.ttl.Milliseconds(), 1)
		calls = append(calls, newCall(renewScript, true, []string{it.st.lockKey}, it.t.Token(), it.t.Fence(), ttl))
		idx = append(idx, i)
	}
	l.do(ctx, calls...)
	for j, c := range calls {
		r := &results[idx[j]]
		r.sent = c.sent
		if c.err != nil {
			r.err = c.err
			continue
		}
		n, err := c.cmd.Int64()
		switch {
		case err != nil:
			r.err = err
		case n == 1 && c.acked != nil:
			r.err = c.acked
		default:
			r.held = n == 1
		}
	}
	return results
}

// listen is the Locker's one subscription (SUBSCRIBE <prefix>:wake:<id>): a
// message names a key whose lock a release reserved for this Locker, and
// wakes the head waiter of that key. go-redis reconnects and resubscribes on
// its own; an idle connection is pinged so a dead one is noticed. A message
// lost meanwhile delays the waiter until it asks again (ticketRefresh), and
// the next waiting Locker until the reservation lapses.
func (l *Locker) listen(ctx context.Context) {
	defer l.wg.Done()
	backoff := 50 * time.Millisecond
	for {
		msg, err := l.pubsub.ReceiveTimeout(ctx, 15*time.Second)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				_ = l.pubsub.Ping(ctx)
				continue
			}
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(backoff*2, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		if m, ok := msg.(*redis.Message); ok && m.Channel == l.wakeChannel() {
			l.wakeChosen(m.Payload)
			continue
		}
		l.redissonMessage(msg)
	}
}
