package redislock

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var scriptNames = map[*redis.Script]string{
	acquireScript: "acquire",
	holdsScript:   "holds",
	releaseScript: "release",
	leaveScript:   "leave",
	renewScript:   "renew",
	lockTTLScript: "ttl",

	acquireRedissonScript: "acquire",
	releaseRedissonScript: "release",
	leaveRedissonScript:   "leave",
}

// ScriptName names the lock script cmd runs ("acquire", "holds" (reentry,
// and a release that is not the last), "release", "leave", "renew", "ttl"), or ""
// for any other command.
func ScriptName(cmd redis.Cmder) string {
	args := cmd.Args()
	if len(args) < 2 {
		return ""
	}
	name, _ := args[0].(string)
	body, _ := args[1].(string)
	for s, n := range scriptNames {
		switch strings.ToLower(name) {
		case "evalsha":
			if body == s.Hash() {
				return n
			}
		case "eval":
			if s.Hash() == redis.NewScript(body).Hash() {
				return n
			}
		}
	}
	return ""
}

// LoadScripts loads every lock script, so that the first EVALSHA of a test
// finds it (no NOSCRIPT, no EVAL fallback).
func LoadScripts(ctx context.Context, c redis.Scripter) error {
	for s := range scriptNames {
		if err := s.Load(ctx, c).Err(); err != nil {
			return err
		}
	}
	return nil
}

// WakeLocal wakes the head waiter of key in l, as the end of one of l's
// own terms on key does.
func WakeLocal(l *Locker, key string) { l.wakeLocal(key) }

// SlotOf is the Redis Cluster hash slot of key.
func SlotOf(key string) int { return int(slot(key)) }

// ID is l's Locker id (the prefix of its tokens, its queue entries' name).
func ID(l *Locker) string { return l.id }

// Leave runs the leave script for key now: l stops waiting for key, and a
// reservation made for it passes on. It returns the Locker id the lock is
// now reserved for, or "".
func Leave(ctx context.Context, l *Locker, key string) (string, error) {
	queue, tickets := l.queueKeys(key)
	c := l.leaveCall(key, []string{l.lockKey(key), queue, tickets})
	l.do(ctx, c)
	if c.err != nil {
		return "", c.err
	}
	return c.cmd.Text()
}

// SetPoll sets how long l's waiting heads sleep before they ask Redis again
// when no wake-up comes (ticketRefresh): a test that lengthens it shows that
// a wake-up, not the poll, ended a wait.
func SetPoll(l *Locker, d time.Duration) { l.poll = d }

// Queued is how many calls of l wait for a pipeline (coalesce.go).
func Queued(l *Locker) int {
	n := 0
	count := func(b *batcher) {
		b.mu.Lock()
		n += b.queued
		b.mu.Unlock()
	}
	count(&l.direct)
	l.bmu.Lock()
	defer l.bmu.Unlock()
	for _, b := range l.batchers {
		count(b)
	}
	return n
}

// LocalWaiters is how many callers of l wait for key in this process.
func LocalWaiters(l *Locker, key string) int {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if q := l.queues[key]; q != nil {
		return len(q.list)
	}
	return 0
}
