package redislock

import (
	"fmt"
	"strconv"
	"strings"
)

// Layout is how a lock key is laid out in Redis (Config.Layout).
type Layout string

const (
	// LayoutCoordinator (the default): the lock is <prefix>:{K}:lock, a
	// hash only the coordinator reads (scripts.go).
	LayoutCoordinator Layout = "coordinator"
	// LayoutRedisson: the lock is the Redisson lock name K itself, so that
	// Redisson's RLock on K and the coordinator's lock on K exclude each
	// other, and their releases wake each other's waiters
	// (scripts_redisson.go, docs/lock.md "Mixed fleets with Redisson").
	LayoutRedisson Layout = "redisson"
)

// ParseLayout reads a layout name ("" is the default, coordinator).
func ParseLayout(s string) (Layout, error) {
	switch Layout(s) {
	case "", LayoutCoordinator:
		return LayoutCoordinator, nil
	case LayoutRedisson:
		return LayoutRedisson, nil
	}
	return "", fmt.Errorf("redislock: layout %q: must be coordinator or redisson", s)
}

// RedissonOwnerPrefix starts the owner a Locker reports for a lock held by
// a Redisson client (redisson:<client id>:<thread id>, the field Redisson's
// RLock keeps its hold count in).
const RedissonOwnerPrefix = "redisson:"

// Redisson's names for the channel its RLock publishes unlocks on, and the
// message: RedissonObject.prefixName("redisson_lock__channel", name), and
// LockPubSub.UNLOCK_MESSAGE (0, as LongCodec writes it). The same in every
// Redisson version tested (3.52.0, 4.7.0).
const (
	redissonChannelPrefix = "redisson_lock__channel"
	redissonUnlockMessage = "0"
)

// redissonChannel is Redisson's unlock channel of lock name K:
// redisson_lock__channel:{K}, or redisson_lock__channel:K when K already
// has a '{' (Redisson does not wrap it twice). It hashes to K's slot, so
// a script that locks K can SPUBLISH on it.
func redissonChannel(key string) string {
	if strings.IndexByte(key, '{') >= 0 {
		return redissonChannelPrefix + ":" + key
	}
	return redissonChannelPrefix + ":{" + key + "}"
}

// keyOfRedissonChannel is the inverse of redissonChannel (for the keys
// this package accepts: no braces).
func keyOfRedissonChannel(ch string) (string, bool) {
	rest, ok := strings.CutPrefix(ch, redissonChannelPrefix+":{")
	if !ok || !strings.HasSuffix(rest, "}") || len(rest) < 2 {
		return "", false
	}
	return rest[:len(rest)-1], true
}

// The keys of lock key K, by layout. Every key of K hashes to one cluster
// slot, so that every script runs in one slot:
//
//	                coordinator        redisson
//	lock            P:{K}:lock         K (Redisson's lock name, as given)
//	fence           P:{K}:fence        P:{K}:fence (the same key: fences keep rising across a layout change)
//	queue, tickets  P:{K}:queue ...    P:{K}:queue ...
//	ended marker    P:{K}:ended:F      P:{K}:ended:F
//
// In the redisson layout the extra keys hash like K: P:{K}:... is K's own
// slot when K has no hash tag (Redis hashes all of a key without one). A
// key with a hash tag is not accepted (ownership.ValidateKey refuses
// braces), so K's slot is always that of the whole K.

func (l *Locker) tag(key string) string { return l.cfg.Prefix + ":{" + key + "}" }

func (l *Locker) lockKey(key string) string {
	if l.cfg.Layout == LayoutRedisson {
		return key
	}
	return l.tag(key) + ":lock"
}

func (l *Locker) fenceKey(key string) string { return l.tag(key) + ":fence" }

func (l *Locker) queueKeys(key string) (queue, tickets string) {
	return l.tag(key) + ":queue", l.tag(key) + ":tickets"
}

func (l *Locker) endedKey(key string, fence int64) string {
	if fence == 0 {
		return l.tag(key) + ":ended:"
	}
	return l.tag(key) + ":ended:" + strconv.FormatInt(fence, 10)
}

func (l *Locker) wakeChannel() string { return l.wakePrefix() + l.id }
func (l *Locker) wakePrefix() string  { return l.cfg.Prefix + ":wake:" }

// keyOf is the inverse of tag: the key between the prefix's "{" and the
// last "}".
func (l *Locker) keyOf(name string) (string, bool) {
	p := l.cfg.Prefix + ":{"
	if !strings.HasPrefix(name, p) {
		return "", false
	}
	rest := name[len(p):]
	i := strings.LastIndexByte(rest, '}')
	if i <= 0 {
		return "", false
	}
	return rest[:i], true
}
