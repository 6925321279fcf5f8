package redislock

import (
	"sync"
	"time"
)

// Waiting. Each key that has waiters in this process has a FIFO queue;
// only its head asks Redis. The head wakes on a release of the key (local,
// or a message on the one pattern subscription), else when the TTL Redis
// reported runs out. When the head acquires, the next waiter becomes head
// and, knowing the lock is now held here, waits for its local release
// instead of asking Redis at once. So same-process waiters are served in
// order (no starvation), a handoff costs one release and one acquire round
// trip, and nobody polls.

type queue struct {
	list      []*waiter
	owner     string // last owner a head saw
	lastFence int64  // highest fence whose release was signalled locally
}

type waiter struct {
	wake chan struct{} // cap 1
	// guarded by Locker.wmu:
	head     bool
	skip     bool          // do not ask Redis on the next round: a local holder will signal
	wait     time.Duration // how long to wait when skipping
	gotLock  bool
	heldTTL  time.Duration
	fallback time.Duration // goroutine-local: TTL reported by Redis
	timedOut bool          // goroutine-local
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

// attempt reports whether w should ask Redis now; if not, w.fallback says
// how long to wait for a signal.
func (w *waiter) attempt(_ *queue, mu *sync.Mutex) bool {
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

func (w *waiter) acquired(_ *queue, mu *sync.Mutex, ttl time.Duration) {
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

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// wakeLocal wakes the head waiter of key after this process released fence.
func (l *Locker) wakeLocal(key string, fence int64) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if q := l.queues[key]; q != nil && len(q.list) > 0 {
		q.lastFence = max(q.lastFence, fence)
		signal(q.list[0].wake)
	}
}

// wakeRemote wakes the head waiter of key on a release message, unless this
// process already signalled that release locally.
func (l *Locker) wakeRemote(key string, fence int64) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if q := l.queues[key]; q != nil && len(q.list) > 0 && (fence == 0 || fence > q.lastFence) {
		signal(q.list[0].wake)
	}
}
