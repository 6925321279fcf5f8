package redislock

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// Locks implements ownership.Inspector: it SCANs <prefix>:{*}:lock on every
// master and reads each hash. Sorted by key.
func (l *Locker) Locks(ctx context.Context) ([]ownership.LockInfo, error) {
	pattern := escapeGlob(l.cfg.Prefix) + ":{*}:lock"
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
	names = slices.Compact(names)
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
