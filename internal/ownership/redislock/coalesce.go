package redislock

import (
	"context"
	"sync"
)

// Auto-pipelining. Calls that goroutines of one process send to the same
// target at the same time go out together, in one pipeline: one write and
// one read for the client, one read event and one write for Redis, instead
// of one each per call. Nothing waits to gather calls: a call sent while
// fewer than maxInflight pipelines of its target are in flight (and none
// queued) goes at once, on the caller's goroutine, as before; calls that
// arrive while they are full queue, and when a pipeline returns, the first
// of them sends all of them (up to maxBatch) on its own goroutine. So one
// goroutine alone never waits for anyone, and many fill each round trip.
//
// Every guarantee of a single call holds for a pipelined one: each script
// is resend-safe on its own (a resent pipeline resends each of them); a
// WAIT after a pipeline counts the writes of all of its calls on that
// connection, so it acknowledges each call that asked for it; calls with
// different needs go to different targets (the client itself, or a node's
// client where WAIT or a redirect needs one); and a caller's context still
// bounds its wait (see submit).

// maxInflight bounds the pipelines a target has in flight at once; maxBatch
// the calls one pipeline carries.
//
// Two pipelines in flight measured best with 16 goroutines on this
// project's 2-core machine (BENCHMARKS.md): one leaves Redis idle while the
// client reads a pipeline's replies, four make smaller batches.
const (
	maxInflight = 2
	maxBatch    = 256
)

// batcher queues the calls for one target.
type batcher struct {
	mu       sync.Mutex
	inflight int
	queue    []*entry
	queued   int // calls in queue
}

// entry is one caller's calls in a batcher's queue, with their target and
// how many replicas must acknowledge them.
type entry struct {
	calls []*call
	t     target
	need  int
	// wake (capacity 1) tells the caller that its calls have their outcome,
	// or that it leads: batch (set before) is the pipeline it sends.
	wake  chan struct{}
	batch []*entry
	taken bool // a pipeline has the calls (batcher.mu)
}

func (l *Locker) batcher(key string) *batcher {
	if key == "" {
		return &l.direct
	}
	l.bmu.Lock()
	defer l.bmu.Unlock()
	b := l.batchers[key]
	if b == nil {
		if l.batchers == nil {
			l.batchers = map[string]*batcher{}
		}
		b = &batcher{}
		l.batchers[key] = b
	}
	return b
}

// submit sends calls on t (see send) and returns when each has its outcome,
// or when ctx ends while they still wait in the queue (then each has ctx's
// error and none was sent). Once a pipeline carries them, submit waits for
// it: their outcome, not ctx, says whether they ran.
//
// A queued caller may be woken to lead instead: it sends the pipeline of
// the calls queued first (its own among them), wakes their callers, and
// hands the slot on before it returns. So the calls of a pipeline wait for
// no goroutine but the one whose calls went first.
func (l *Locker) submit(ctx context.Context, t target, need int, calls []*call) {
	b := l.batcher(t.key)
	b.mu.Lock()
	if b.inflight < maxInflight && len(b.queue) == 0 {
		b.inflight++
		b.mu.Unlock()
		l.send(ctx, t, need, calls)
		l.handOn(b)
		return
	}
	e := &entry{calls: calls, t: t, need: need, wake: make(chan struct{}, 1)}
	b.queue = append(b.queue, e)
	b.queued += len(calls)
	b.mu.Unlock()
	select {
	case <-e.wake:
	case <-ctx.Done():
		b.mu.Lock()
		if !e.taken {
			b.remove(e)
			b.mu.Unlock()
			for _, c := range calls {
				c.err = ctx.Err()
			}
			return
		}
		b.mu.Unlock()
		<-e.wake // taken: its outcome comes, or the lead
	}
	if e.batch != nil {
		l.lead(b, e.batch)
	}
}

func (b *batcher) remove(e *entry) {
	for i, x := range b.queue {
		if x == e {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			b.queued -= len(e.calls)
			return
		}
	}
}

// lead sends batch in one pipeline, wakes its other callers, and hands the
// slot on. Its context is none of the callers': the go-redis timeouts bound
// it, as they bound a call whose context has no deadline.
func (l *Locker) lead(b *batcher, batch []*entry) {
	var calls []*call
	need := 0
	for _, e := range batch {
		calls = append(calls, e.calls...)
		need = max(need, e.need)
	}
	// One target per batcher: the client itself, or one node's client
	// (go-redis' or the Locker's own, both on that address).
	l.send(context.Background(), batch[0].t, need, calls)
	for _, e := range batch[1:] {
		e.wake <- struct{}{}
	}
	l.handOn(b)
}

// handOn passes the pipeline slot of a finished send to the first caller
// that queued meanwhile, with up to maxBatch calls' worth of the queue for
// it to send, or gives the slot back when none queued.
func (l *Locker) handOn(b *batcher) {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inflight--
		b.mu.Unlock()
		return
	}
	n, calls := 0, 0
	for n < len(b.queue) && (n == 0 || calls+len(b.queue[n].calls) <= maxBatch) {
		b.queue[n].taken = true
		calls += len(b.queue[n].calls)
		n++
	}
	batch := append([]*entry(nil), b.queue[:n]...)
	b.queue = append(b.queue[:0], b.queue[n:]...)
	b.queued -= calls
	b.mu.Unlock()
	batch[0].batch = batch
	batch[0].wake <- struct{}{}
}
