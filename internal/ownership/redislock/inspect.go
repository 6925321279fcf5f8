package redislock

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// Locks implements ownership.Inspector: it SCANs <prefix>:{*}:lock on every
// master and reads each hash. Sorted by key. In the redisson layout it
// SCANs the fence keys instead (the locks are bare names) and reads the
// lock of each: see locksRedisson.
func (l *Locker) Locks(ctx context.Context) ([]ownership.LockInfo, error) {
	if l.cfg.Layout == LayoutRedisson {
		return l.locksRedisson(ctx)
	}
	names, err := l.scanNames(ctx, escapeGlob(l.cfg.Prefix)+":{*}:lock")
	if err != nil {
		return nil, err
	}
	pipe := l.client.Pipeline()
	hm := make([]*redis.SliceCmd, len(names))
	pt := make([]*redis.DurationCmd, len(names))
	wq := make([]*redis.IntCmd, len(names))
	for i, n := range names {
		hm[i] = pipe.HMGet(ctx, n, "replica", "fence", "holds")
		pt[i] = pipe.PTTL(ctx, n)
		if key, ok := l.keyOf(n); ok {
			queue, _ := l.queueKeys(key)
			wq[i] = pipe.ZCard(ctx, queue)
		}
	}
	if len(names) > 0 {
		if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
			return nil, err
		}
	}
	out := make([]ownership.LockInfo, 0, len(names))
	for i, n := range names {
		key, ok := l.keyOf(n)
		vals, err := hm[i].Result()
		if !ok || err != nil || len(vals) != 3 || vals[0] == nil {
			continue // released between SCAN and HMGET, or not ours
		}
		info := ownership.LockInfo{Key: key, Owner: str(vals[0]), Fence: num(vals[1]), Holds: num(vals[2])}
		if vals[2] == nil {
			info.Holds = 1 // no reentry yet: the acquire writes no holds field
		}
		if d, err := pt[i].Result(); err == nil && d > 0 {
			info.TTL = d.Round(time.Millisecond)
		}
		if wq[i] != nil {
			info.Waiters = wq[i].Val()
		}
		out = append(out, info)
	}
	return out, nil
}

// locksRedisson lists, in the redisson layout, the locks held now on the
// keys the coordinator has ever locked (each has a fence key,
// <prefix>:{K}:fence, which has no TTL): a replica's lock shows its
// replica, fence and holds; a Redisson client's shows its owner as
// redisson:<client id>:<thread id>, its hold count, and fence 0 (a
// Redisson holder has none). Redisson locks on names no replica ever
// locked are not listed: nothing in Redis tells them from other hashes.
func (l *Locker) locksRedisson(ctx context.Context) ([]ownership.LockInfo, error) {
	fences, err := l.scanNames(ctx, escapeGlob(l.cfg.Prefix)+":{*}:fence")
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(fences))
	for _, f := range fences {
		if k, ok := l.keyOf(f); ok && ownership.ValidateKey(k) == nil {
			keys = append(keys, k)
		}
	}
	pipe := l.client.Pipeline()
	all := make([]*redis.MapStringStringCmd, len(keys))
	pt := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		all[i] = pipe.HGetAll(ctx, l.lockKey(k))
		pt[i] = pipe.PTTL(ctx, l.lockKey(k))
	}
	if len(keys) > 0 {
		if _, err := pipe.Exec(ctx); err != nil && !isRedisReply(err) {
			return nil, err
		}
	}
	out := make([]ownership.LockInfo, 0, len(keys))
	for i, k := range keys {
		h, err := all[i].Result()
		if err != nil || len(h) == 0 {
			continue // not held (or not a hash: not a lock)
		}
		info := ownership.LockInfo{Key: k}
		switch {
		case h["owner"] != "":
			info.Owner, info.Fence, info.Holds = h["replica"], num(h["fence"]), num(h["holds"])
			if _, ok := h["holds"]; !ok {
				info.Holds = 1
			}
		case h["reserved"] != "":
			continue // handed off, not yet taken
		default:
			// Another client's: Redisson's RLock keeps one field,
			// <client id>:<thread id> -> hold count.
			fields := make([]string, 0, len(h))
			for f := range h {
				fields = append(fields, f)
			}
			slices.Sort(fields)
			info.Owner, info.Holds = RedissonOwnerPrefix+fields[0], num(h[fields[0]])
		}
		if d, err := pt[i].Result(); err == nil && d > 0 {
			info.TTL = d.Round(time.Millisecond)
		}
		out = append(out, info)
	}
	return out, nil
}

// isRedisReply: err is an error reply of Redis for one command (WRONGTYPE
// on a key that is not a hash), not a failure of the connection.
func isRedisReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// scanNames SCANs pattern on every master; sorted, without duplicates.
func (l *Locker) scanNames(ctx context.Context, pattern string) ([]string, error) {
	var mu sync.Mutex
	var names []string
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			names = append(names, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := l.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, l.client)
	}
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// escapeGlob makes s match itself literally in a Redis glob pattern (SCAN
// MATCH): the prefix may contain * ? [ ] or \.
func escapeGlob(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func num(v any) int64 {
	var n int64
	for _, c := range strings.TrimSpace(str(v)) {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int64(c-'0')
	}
	return n
}
