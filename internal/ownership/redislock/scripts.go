package redislock

import "github.com/redis/go-redis/v9"

// The lock is a hash at <prefix>:{<key>}:lock with fields
//
//	owner   the lease's token (replica id + random, unique per acquisition)
//	replica the replica id, shown to contenders and in `coordinator locks`
//	holds   the hold count (reentrant acquisitions)
//	fence   the fencing token of this acquisition
//	waiting the Locker id of the first contender that found the lock held:
//	        only then does the release PUBLISH (uncontended locks cost no
//	        pub/sub traffic), and it reserves the next term for that Locker
//
// A reservation is the same key holding only {reserved: Locker id} for
// handoffMS; no other script mistakes it for a held lock (no owner).
//
// and a PTTL. The fence counter <prefix>:{<key>}:fence never expires: it is
// one integer per key ever locked, and "strictly increasing per key" must
// survive any idle gap. Every script touches keys of one hash tag only, so
// all of them run in one cluster slot (no CROSSSLOT).

// acquireScript: KEYS lock, fence; ARGV token, replica, ttl ms, locker
// id. Returns {1, fence} when acquired (also when this very token already
// holds it: a retried request is idempotent). Otherwise returns
// {0, pttl, replica}: the lock is held (the first contender of this term
// records its Locker id in 'waiting'), or it was just released to another
// Locker that waited for it and is reserved for it for a few ms (then the
// hash has only a 'reserved' field, and replica is ”).
var acquireScript = redis.NewScript(`
local cur = redis.call('hmget', KEYS[1], 'owner', 'fence', 'reserved')
if cur[1] == false then
  if cur[3] then
    if cur[3] ~= ARGV[4] then
      return {0, redis.call('pttl', KEYS[1]), ''}
    end
    redis.call('del', KEYS[1])
  end
  local fence = redis.call('incr', KEYS[2])
  redis.call('hset', KEYS[1], 'owner', ARGV[1], 'replica', ARGV[2], 'holds', 1, 'fence', fence)
  redis.call('pexpire', KEYS[1], ARGV[3])
  return {1, fence}
end
if cur[1] == ARGV[1] then
  return {1, tonumber(cur[2])}
end
redis.call('hsetnx', KEYS[1], 'waiting', ARGV[4])
return {0, redis.call('pttl', KEYS[1]), redis.call('hget', KEYS[1], 'replica') or ''}
`)

// reenterScript: KEYS lock; ARGV token, fence. Returns {holds, ”} when the
// term still holds the lock, else {0, replica of the current owner or ”}.
var reenterScript = redis.NewScript(`
local cur = redis.call('hmget', KEYS[1], 'owner', 'fence', 'replica')
if cur[1] == ARGV[1] and cur[2] == ARGV[2] then
  return {redis.call('hincrby', KEYS[1], 'holds', 1), ''}
end
return {0, cur[3] or ''}
`)

// releaseScript: KEYS lock, channel; ARGV token, fence, locker id,
// handoff ms. Gives up one hold: returns the holds left (0: the lock is
// gone), or -1 when the term no longer holds the lock (nothing is touched).
// When a contender waited, the last hold also publishes a release message
// and, if the first contender was another Locker, leaves the key reserved
// for that Locker for the handoff time, so that the releasing process
// cannot barge back in ahead of processes that waited (no cross-process
// starvation).
var releaseScript = redis.NewScript(`
local cur = redis.call('hmget', KEYS[1], 'owner', 'fence', 'waiting', 'holds')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then
  return -1
end
if cur[4] ~= '1' then
  local holds = redis.call('hincrby', KEYS[1], 'holds', -1)
  if holds > 0 then
    return holds
  end
end
redis.call('del', KEYS[1])
if cur[3] then
  if cur[3] ~= ARGV[3] then
    redis.call('hset', KEYS[1], 'reserved', cur[3])
    redis.call('pexpire', KEYS[1], ARGV[4])
  end
  redis.call('publish', KEYS[2], ARGV[2])
end
return 0
`)

// renewScript: KEYS lock; ARGV token, fence, ttl ms. Returns 1 when the term
// still holds the lock (its TTL is reset), else 0.
var renewScript = redis.NewScript(`
local cur = redis.call('hmget', KEYS[1], 'owner', 'fence')
if cur[1] == ARGV[1] and cur[2] == ARGV[2] then
  redis.call('pexpire', KEYS[1], ARGV[3])
  return 1
end
return 0
`)
