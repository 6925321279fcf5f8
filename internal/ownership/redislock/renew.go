package redislock

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
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
// (or belongs to another term) is lost at once; one whose renewal fails
// keeps its trust deadline, and is lost when it passes.
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
		results, sent := l.renewBatch(ctx, batch)
		for i, it := range batch {
			r := results[i]
			switch {
			case r.skipped:
			case r.err != nil:
				failed++
				firstErr = cmpErr(firstErr, r.err)
			case r.held:
				ok++
				if !it.t.Ended() {
					it.st.timer.Reset(time.Until(ownership.TrustDeadline(sent, it.st.ttl)))
				}
			default:
				gone++
				l.lose(it.t, "renewal found the lock gone")
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
}

// renewBatch sends one pipeline of renewals while holding roundMu, so that
// a Release can wait for a batch that may carry its term.
func (l *Locker) renewBatch(ctx context.Context, batch []renewItem) ([]renewResult, time.Time) {
	l.roundMu.Lock()
	defer l.roundMu.Unlock()
	results := make([]renewResult, len(batch))
	l.mu.Lock()
	for i, it := range batch {
		results[i].skipped = !it.st.renewing
	}
	l.mu.Unlock()

	sent := time.Now()
	cmds := make([]*redis.Cmd, len(batch))
	run := func(useEval bool, which func(i int) bool) {
		pipe := l.client.Pipeline()
		for i, it := range batch {
			if !which(i) {
				continue
			}
			keys := []string{it.st.lockKey}
			ttl := max(it.st.ttl.Milliseconds(), 1)
			if useEval {
				cmds[i] = renewScript.Eval(ctx, pipe, keys, it.t.Token(), it.t.Fence(), ttl)
			} else {
				cmds[i] = renewScript.EvalSha(ctx, pipe, keys, it.t.Token(), it.t.Fence(), ttl)
			}
		}
		_, _ = pipe.Exec(ctx)
	}
	run(false, func(i int) bool { return !results[i].skipped })
	// NOSCRIPT (a restarted or flushed Redis): send those again as EVAL,
	// which also caches the script for the next round.
	if slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return c != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") }) {
		retry := make([]bool, len(cmds))
		for i, c := range cmds {
			retry[i] = c != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT")
		}
		run(true, func(i int) bool { return retry[i] })
	}
	for i, c := range cmds {
		if c == nil {
			continue
		}
		n, err := c.Int64()
		results[i] = renewResult{held: err == nil && n == 1, err: err}
	}
	return results, sent
}

// listen is the Locker's one subscription (PSUBSCRIBE <prefix>:{*}:released):
// a release message wakes the head waiter of its key. go-redis reconnects
// and resubscribes on its own; an idle connection is pinged so a dead one is
// noticed. Messages lost meanwhile only delay waiters to their TTL fallback.
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
		if m, ok := msg.(*redis.Message); ok {
			if key, ok := l.keyOf(m.Channel); ok {
				fence, _ := strconv.ParseInt(m.Payload, 10, 64)
				l.wakeRemote(key, fence)
			}
		}
	}
}
