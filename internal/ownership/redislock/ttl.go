package redislock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// lockTTLScript: KEYS lock; ARGV fence. Returns the lock's PTTL (ms) when
// the term with this fence holds it, else 0. One script, so the fence and
// the TTL are read together, with no command outside the lock's ACL
// (docs/security.md: no MULTI).
var lockTTLScript = redis.NewScript(`
if redis.call('hget', KEYS[1], 'fence') == ARGV[1] then
  local ms = redis.call('pttl', KEYS[1])
  if ms > 0 then
    return ms
  end
end
return 0
`)

// LockTTL reads key's lock on Redis: how long Redis will keep it, and
// whether it is still the term with fence (held false: gone or another
// term's). `coordinator lock` times its command's termination by what
// Redis confirms, and kills at once when the lock is gone or taken over.
func (l *Locker) LockTTL(ctx context.Context, key string, fence int64) (ttl time.Duration, held bool, err error) {
	c := newCall(lockTTLScript, false, []string{l.lockKey(key)}, fence)
	l.do(ctx, c)
	if c.err != nil {
		return 0, false, c.err
	}
	ms, err := c.cmd.Int64()
	if err != nil || ms <= 0 {
		return 0, false, err
	}
	return time.Duration(ms) * time.Millisecond, true, nil
}
