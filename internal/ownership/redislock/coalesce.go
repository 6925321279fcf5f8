package redislock

import (
	"context"
	"errors"
	"sync"
)

// Auto-pipelining. Calls that goroutines of one process send to the same
// target at the same time go out together, in one pipeline: one write and
// one read for the client, one read event and one write for Redis, instead
// of one each per call. Nothing waits to gather calls: a call sent while
// fewer than maxInflight pipelines of its target are in flight (and none
// queued) goes at once, on the caller's goroutine and under its context,
// as before; calls that arrive while they are full queue, and when a
// pipeline returns, a flusher goroutine sends all of them (up to maxBatch),
// and goes on sending what queued meanwhile until the queue is empty. So
// one goroutine alone never waits for anyone, and many fill each round
// trip.
//
// Every guarantee of a single call holds for a pipelined one: each script
// is resend-safe on its own (a resent pipeline resends each of them); a
// WAIT after a pipeline counts the writes of all of its calls on that
// connection, so it acknowledges each call that asked for it; calls with
// different needs go to different targets (the client itself, or a node's
// client where WAIT or a redirect needs one); and a caller's context still
// bounds its wait, queued or sent (see submit).

// maxInflight bounds the pipelines a target has in flight at once; maxBatch
// the calls one pipeline carries.
//
// Two pipelines in flight: one leaves Redis idle while the client reads a
// pipeline's replies, more make smaller batches.
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
	// closed: the Locker closed; queued calls are not sent (closeBatchers).
	closed bool
}

// entry is one caller's calls in a batcher's queue, with their target and
// how many replicas must acknowledge them.
type entry struct {
	calls []*call // the caller's
	// sent are copies of calls, which the pipeline records its answers in:
	// a caller that leaves never shares a call with the flusher.
	sent  []*call
	t     target
	need  int
	state entryState // batcher.mu
	// done is closed once the pipeline's answers are in (copied to calls,
	// unless the caller left).
	done chan struct{}
}

type entryState int

const (
	queued    entryState = iota
	taken                // a pipeline carries the calls
	answered             // their answers are in calls
	abandoned            // taken, and the caller left before the answers came
)

// errSentAndLeft is the outcome of a call whose caller's context ended while a
// pipeline carried it: it may have run, and its answer came too late for
// the caller (as for a call sent alone whose context ends meanwhile).
type errSentAndLeft struct {
	cause error
	// answered is closed once the pipeline's answer is in: a delete of what
	// the call may have written waits for it, or it could run first.
	answered <-chan struct{}
}

func (e *errSentAndLeft) Error() string {
	return "redislock: sent in a pipeline; the caller's context ended before the answer: " + e.cause.Error()
}

func (e *errSentAndLeft) Unwrap() error { return e.cause }

// sentAndLeft returns when the pipeline that carried a call which failed
// with err has answered (at once for any other err).
func sentAndLeft(err error) <-chan struct{} {
	var e *errSentAndLeft
	if errors.As(err, &e) {
		return e.answered
	}
	return nil
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
		b = &batcher{closed: l.bclosed}
		l.batchers[key] = b
	}
	return b
}

// submit sends calls on t (see send) and returns when each has its outcome,
// or when ctx ends first. If ctx ends while they still wait in the queue,
// none was sent and each has ctx's error. If it ends while a pipeline
// carries them, each has an errSentAndLeft: the caller handles it as a send
// whose context ended (the script may have run), and a delete by token it
// sends waits for the pipeline's answer (cleanupAfter).
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
	if b.closed {
		// No flusher sends after Close: never sent, nothing written.
		b.mu.Unlock()
		for _, c := range calls {
			c.err, c.acked = errClosed, nil
		}
		return
	}
	e := &entry{calls: calls, sent: make([]*call, len(calls)), t: t, need: need, done: make(chan struct{})}
	for i, c := range calls {
		cp := *c
		e.sent[i] = &cp
	}
	b.queue = append(b.queue, e)
	b.queued += len(calls)
	b.mu.Unlock()
	select {
	case <-e.done:
		return
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch e.state {
	case queued:
		b.remove(e)
		for _, c := range calls {
			c.err = ctx.Err()
		}
	case taken:
		e.state = abandoned
		err := &errSentAndLeft{cause: ctx.Err(), answered: e.done}
		for _, c := range calls {
			c.err, c.acked = err, nil
		}
	case answered, abandoned:
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

// handOn passes the pipeline slot of a finished send to a flusher for the
// calls that queued meanwhile, or gives it back when none queued.
// The flusher is counted under b.mu, so that Close, which marks b closed
// under b.mu before it waits for the flushers, either waits for it or
// sees no flusher start.
func (l *Locker) handOn(b *batcher) {
	b.mu.Lock()
	batch := b.takeLocked()
	if batch != nil {
		l.flushes.Add(1)
	}
	b.mu.Unlock()
	if batch != nil {
		go l.flush(b, batch)
	}
}

// take returns up to maxBatch calls' worth of the queue (the first entry
// always), marked taken, or gives the slot back and returns nil when none
// queued (or the Locker closed: the queued calls then fail, unsent).
func (b *batcher) take() []*entry {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.takeLocked()
}

func (b *batcher) takeLocked() []*entry {
	if b.closed {
		b.failQueued(errClosed)
	}
	if len(b.queue) == 0 {
		b.inflight--
		return nil
	}
	n, calls := 0, 0
	for n < len(b.queue) && (n == 0 || calls+len(b.queue[n].calls) <= maxBatch) {
		b.queue[n].state = taken
		calls += len(b.queue[n].calls)
		n++
	}
	batch := append([]*entry(nil), b.queue[:n]...)
	b.queue = append(b.queue[:0], b.queue[n:]...)
	b.queued -= calls
	return batch
}

// flush sends batch in one pipeline, hands each caller its answers, and
// goes on with what queued meanwhile until the queue is empty. Its context
// is none of the callers': the go-redis timeouts bound it, as they bound a
// call whose context has no deadline; a caller whose context ends first
// leaves (submit).
func (l *Locker) flush(b *batcher, batch []*entry) {
	defer l.flushes.Done()
	for batch != nil {
		var calls []*call
		need := 0
		for _, e := range batch {
			calls = append(calls, e.sent...)
			need = max(need, e.need)
		}
		// One target per batcher: the client itself, or one node's client
		// (go-redis' or the Locker's own, both on that address).
		l.send(context.Background(), batch[0].t, need, calls)
		b.mu.Lock()
		for _, e := range batch {
			if e.state == taken {
				for i, c := range e.calls {
					*c = *e.sent[i]
				}
				e.state = answered
			}
		}
		b.mu.Unlock()
		for _, e := range batch {
			close(e.done)
		}
		batch = b.take()
	}
}

// failQueued answers every queued call with err: none was sent.
func (b *batcher) failQueued(err error) {
	for _, e := range b.queue {
		for _, c := range e.calls {
			c.err, c.acked = err, nil
		}
		e.state = answered
		close(e.done)
	}
	b.queue, b.queued = nil, 0
}

// closeBatchers stops every batcher sending what queues: the calls queued
// now and later fail with errClosed, unsent (Close). Pipelines already in
// flight finish; Close waits for their flushers.
func (l *Locker) closeBatchers() {
	l.bmu.Lock()
	l.bclosed = true
	bs := []*batcher{&l.direct}
	for _, b := range l.batchers {
		bs = append(bs, b)
	}
	l.bmu.Unlock()
	for _, b := range bs {
		b.mu.Lock()
		b.closed = true
		b.failQueued(errClosed)
		b.mu.Unlock()
	}
}
