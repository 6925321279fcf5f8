package redislock

import (
	"context"
	"sync"
	"time"
)

// Waiting, in two levels.
//
// In this process, each key that has waiters has a FIFO queue; only its
// head asks Redis. When the head acquires, the next waiter becomes head
// and, knowing the lock is now held here, waits for the local release
// instead of asking Redis at once. Any end of a term of this process
// (release or loss) wakes the local head.
//
// Across processes, a head that finds the key held queues its Locker in
// Redis (<key>:queue, by arrival; <key>:tickets, by ticket expiry) in the
// same script. The release of a term during which someone queued reserves
// the lock for the oldest Locker whose ticket is live and publishes on that
// Locker's own wake channel, so exactly one waiting Locker wakes and
// acquires; everyone else sleeps on. A head renews its ticket by asking
// again at least every ticketRefresh; a Locker that stops waiting leaves the
// queue (passing on a reservation made for it); one that died is dropped
// when its ticket lapses, and a reservation made for it lapses after
// handoffMS. So nobody waits on a dead waiter for longer than ticketTTL,
// and nobody polls faster than ticketRefresh.

type queue struct {
	list   []*waiter
	owner  string // last owner a head saw
	queued bool   // this Locker may have an entry in the key's Redis queue
}

type waiter struct {
	wake chan struct{} // cap 1
	// guarded by Locker.wmu:
	head    bool
	skip    bool          // do not ask Redis on the next round: a local holder will signal
	wait    time.Duration // how long to wait when skipping
	gotLock bool
	heldTTL time.Duration
	// goroutine-local: how long to wait for a signal before asking again.
	fallback time.Duration
}

const forever = 365 * 24 * time.Hour

func (l *Locker) enqueue(key string) (*waiter, *queue) {
	w := &waiter{wake: make(chan struct{}, 1), fallback: forever}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	q := l.queues[key]
	if q == nil {
		q = &queue{}
		l.queues[key] = q
	}
	q.list = append(q.list, w)
	w.head = len(q.list) == 1
	return w, q
}

// dequeue takes w out of key's queue; the next waiter becomes head. When
// nobody of this process waits any more, the Locker leaves the key's Redis
// queue.
func (l *Locker) dequeue(key string, w *waiter, q *queue) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	for i, x := range q.list {
		if x == w {
			q.list = append(q.list[:i], q.list[i+1:]...)
			break
		}
	}
	if len(q.list) == 0 {
		if l.queues[key] == q {
			delete(l.queues, key)
		}
		if q.queued {
			l.leave(key)
		}
		return
	}
	if w.head {
		next := q.list[0]
		next.head = true
		if w.gotLock {
			next.skip, next.wait = true, w.heldTTL
		}
		signal(next.wake)
	}
}

// leave takes this Locker out of key's Redis queue in the background, best
// effort (a lapsed ticket does the same later).
func (l *Locker) leave(key string) {
	l.background(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		queue, tickets := l.queueKeys(key)
		c := l.leaveCall(key, []string{l.lockKey(key), queue, tickets})
		l.do(ctx, c)
		if err := c.err; err != nil {
			l.log.Debug("lock_queue_leave_failed", "lock_key", key, "error", err)
		}
	})
}

// attempt reports whether w should ask Redis now; if not, w.fallback says
// how long to wait for a signal.
func (w *waiter) attempt(mu *sync.Mutex) bool {
	mu.Lock()
	defer mu.Unlock()
	switch {
	case !w.head:
		w.fallback = forever
		return false
	case w.skip:
		w.skip = false
		w.fallback = w.wait
		return false
	}
	return true
}

func (w *waiter) acquired(mu *sync.Mutex, ttl time.Duration) {
	mu.Lock()
	w.gotLock, w.heldTTL = true, ttl
	mu.Unlock()
}

func (q *queue) seen(mu *sync.Mutex, owner string) {
	mu.Lock()
	q.owner = owner
	mu.Unlock()
}

func (q *queue) lastOwner(mu *sync.Mutex) string {
	mu.Lock()
	defer mu.Unlock()
	return q.owner
}

func (q *queue) isQueued(mu *sync.Mutex) bool {
	mu.Lock()
	defer mu.Unlock()
	return q.queued
}

func (q *queue) setQueued(mu *sync.Mutex, v bool) {
	mu.Lock()
	q.queued = v
	mu.Unlock()
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// wakeLocal wakes the head waiter of key after a term of this process on
// key ended.
func (l *Locker) wakeLocal(key string) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if q := l.queues[key]; q != nil && len(q.list) > 0 {
		signal(q.list[0].wake)
	}
}

// wakeChosen handles a wake message: a release reserved key for this
// Locker. The head waiter takes it; with nobody waiting here any more, the
// reservation is passed on at once.
func (l *Locker) wakeChosen(key string) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if q := l.queues[key]; q != nil && len(q.list) > 0 {
		signal(q.list[0].wake)
		return
	}
	l.leave(key)
}
