package redislock

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Waiting for a Redisson holder (redisson layout).
//
// A coordinator release wakes the next waiting Locker on its own wake
// channel (queue.go). A Redisson client's unlock() knows nothing of that: it
// publishes 0 on redisson_lock__channel:{K}, with PUBLISH, or with SPUBLISH
// on a Redis 7 cluster (Redisson's shardedSubscriptionMode AUTO, the
// default). So while a Locker waits for K, and only after Redis answered
// that K is held, it listens there too, as Redisson's own waiters do: on its
// one subscription connection (SUBSCRIBE), and on a cluster also with
// SSUBSCRIBE on a connection to the node of K's slot (a sharded
// subscription is per slot). The confirmation of the subscription wakes the
// head waiter once more, so that an unlock between its last answer and the
// subscription is not missed. An unlock message wakes the head waiter of K
// unless the last holder it saw was a replica (whose release wakes the
// chosen Locker alone, on its wake channel, and also publishes here for the
// Redisson waiters). A message lost meanwhile costs a waiter its next poll
// (ticketRefresh).

// rsub is one key's Redisson unlock subscription.
type rsub struct {
	refs int        // waiters of this Locker using it (Locker.rmu)
	mu   sync.Mutex // orders the key's subscribe and unsubscribe
	on   bool       // subscribed (mu)
	// sharded is the SSUBSCRIBE connection on a cluster (mu).
	sharded *redis.PubSub
}

// shardedArg tells the redisson scripts to SPUBLISH as well (on a
// cluster). Redisson (3.2x on, including 3.52.0 and 4.7.0) publishes and
// subscribes its unlock channel with SPUBLISH/SSUBSCRIBE on a cluster whose
// nodes support sharded pub/sub (Redis 7; shardedSubscriptionMode AUTO, its
// default), and with PUBLISH/SUBSCRIBE everywhere else.
func (l *Locker) shardedArg() string {
	if l.cluster {
		return "1"
	}
	return "0"
}

// watchRedisson subscribes this Locker to Redisson's unlock channel of key
// (once, however many of its waiters call it) until stop is called. It
// returns nil in the coordinator layout.
func (l *Locker) watchRedisson(key string) (stop func()) {
	if l.cfg.Layout != LayoutRedisson {
		return nil
	}
	l.rmu.Lock()
	s := l.rsubs[key]
	if s == nil {
		s = &rsub{}
		l.rsubs[key] = s
	}
	s.refs++
	l.rmu.Unlock()
	s.mu.Lock()
	if !s.on {
		l.subscribeRedisson(key, s)
		s.on = true
	}
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			// Not on the caller's way out of Acquire: a write to a stuck
			// connection would delay it. After Close nothing is left to do.
			l.background(func() { l.unwatchRedisson(key, s) })
		})
	}
}

func (l *Locker) unwatchRedisson(key string, s *rsub) {
	l.rmu.Lock()
	s.refs--
	last := s.refs == 0
	l.rmu.Unlock()
	if !last {
		return
	}
	s.mu.Lock()
	l.rmu.Lock()
	idle := s.refs == 0 // nobody came back meanwhile
	l.rmu.Unlock()
	if idle && s.on {
		l.unsubscribeRedisson(key, s)
		s.on = false
	}
	s.mu.Unlock()
	l.rmu.Lock()
	if s.refs == 0 && l.rsubs[key] == s {
		delete(l.rsubs, key)
	}
	l.rmu.Unlock()
}

// subscribeRedisson subscribes to key's Redisson channel (s.mu held).
// Failures are logged: the subscriptions retry on reconnect, and the
// waiter polls meanwhile.
func (l *Locker) subscribeRedisson(key string, s *rsub) {
	ctx, cancel := context.WithTimeout(l.runCtx, DefaultDialTimeout+DefaultWriteTimeout)
	defer cancel()
	ch := redissonChannel(key)
	if err := l.pubsub.Subscribe(ctx, ch); err != nil {
		l.log.Debug("lock_redisson_subscribe_failed", "lock_key", key, "error", err)
	}
	cc, ok := l.client.(*redis.ClusterClient)
	if !ok {
		return
	}
	ps := cc.SSubscribe(ctx, ch)
	if !l.background(func() { l.listenSharded(ps, key) }) {
		_ = ps.Close() // closed meanwhile
		return
	}
	s.sharded = ps
}

// unsubscribeRedisson undoes subscribeRedisson (s.mu held).
func (l *Locker) unsubscribeRedisson(key string, s *rsub) {
	ctx, cancel := context.WithTimeout(l.runCtx, DefaultWriteTimeout)
	defer cancel()
	if err := l.pubsub.Unsubscribe(ctx, redissonChannel(key)); err != nil {
		l.log.Debug("lock_redisson_unsubscribe_failed", "lock_key", key, "error", err)
	}
	if s.sharded != nil {
		_ = s.sharded.Close()
		s.sharded = nil
	}
}

// closeRedissonSubs closes the sharded subscriptions (Close, after new
// background work is refused, so none starts after it).
func (l *Locker) closeRedissonSubs() {
	l.rmu.Lock()
	subs := make([]*rsub, 0, len(l.rsubs))
	for _, s := range l.rsubs {
		subs = append(subs, s)
	}
	l.rmu.Unlock()
	for _, s := range subs {
		s.mu.Lock()
		if s.sharded != nil {
			_ = s.sharded.Close()
			s.sharded = nil
		}
		s.mu.Unlock()
	}
}

// listenSharded reads one key's SSUBSCRIBE connection until it is closed.
func (l *Locker) listenSharded(ps *redis.PubSub, key string) {
	backoff := 50 * time.Millisecond
	for {
		msg, err := ps.ReceiveTimeout(l.runCtx, 15*time.Second)
		if l.runCtx.Err() != nil || errors.Is(err, redis.ErrClosed) {
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				_ = ps.Ping(l.runCtx)
				continue
			}
			t := time.NewTimer(backoff)
			select {
			case <-l.runCtx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(backoff*2, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "ssubscribe" {
				l.redissonWake(key, true)
			}
		case *redis.Message:
			l.redissonWake(key, false)
		}
	}
}

// redissonMessage handles what the Locker's main subscription received on a
// Redisson channel; it reports false for any other channel.
func (l *Locker) redissonMessage(msg any) bool {
	switch m := msg.(type) {
	case *redis.Subscription:
		if key, ok := keyOfRedissonChannel(m.Channel); ok && m.Kind == "subscribe" {
			l.redissonWake(key, true)
			return true
		}
	case *redis.Message:
		if key, ok := keyOfRedissonChannel(m.Channel); ok {
			l.redissonWake(key, false)
			return true
		}
	}
	return false
}

// redissonWake wakes the head waiter of key: its subscription is confirmed
// (subscribed), or a Redisson unlock was published. The latter is ignored
// when the last holder the waiters saw was a replica: its release wakes the
// Locker it hands the lock to on that Locker's own channel.
func (l *Locker) redissonWake(key string, subscribed bool) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	q := l.queues[key]
	if q == nil || len(q.list) == 0 {
		return
	}
	if !subscribed && q.owner != "" && !strings.HasPrefix(q.owner, RedissonOwnerPrefix) {
		return
	}
	signal(q.list[0].wake)
}
