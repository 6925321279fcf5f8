package redislock

import "github.com/redis/go-redis/v9"

// The acquire and release scripts as they were before issue 18's trims
// (commit 38d339b), frozen for BenchmarkServerCost and
// BenchmarkAcquireRelease to run beside the current ones in the same run.
// Not used by the Locker.

// before18HandoffLua picks the oldest live waiting Locker of KEYS lock/queue/
// tickets (ticket not expired), reserves the lock for it for ARGV handoff ms
// and publishes the key on its wake channel. Expired tickets are dropped.
// Returns the Locker id, or false when nobody waits.
const before18HandoffLua = `
local function handoff(lock, queue, tickets, handoffms, prefix, key)
  local t = redis.call('time')
  local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local dead = redis.call('zrangebyscore', tickets, '-inf', nowms)
  if #dead > 0 then
    redis.call('zrem', queue, unpack(dead))
    redis.call('zrem', tickets, unpack(dead))
  end
  local head = redis.call('zrange', queue, 0, 0)[1]
  if head then
    redis.call('hset', lock, 'reserved', head)
    redis.call('pexpire', lock, handoffms)
    redis.call('publish', prefix .. ':wake:' .. head, key)
    return head
  end
  return false
end
`

// before18AcquireScript: KEYS lock, fence, queue, tickets; ARGV token, replica, ttl
// ms, Locker id, ticket ms (0: do not queue), queue ms (the queue keys'
// PTTL, at least any ticket), queued ('1' when this Locker may have a queue
// entry).
//
// Returns {1, fence} when acquired, also when this very token already holds
// it (a resend: the TTL is set again, nothing else changes). Otherwise
// {0, pttl, replica, reserved}: the lock is held (replica is the holder's)
// or reserved for another waiting Locker (replica ”, reserved its id); the
// caller's Locker is queued (or its ticket renewed; its place is kept).
var before18AcquireScript = redis.NewScript(`
local cur = redis.call('hmget', KEYS[1], 'owner', 'fence', 'reserved', 'replica')
if cur[1] == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[3])
  return {1, tonumber(cur[2])}
end
local t = redis.call('time')
local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
if cur[1] == false and (cur[3] == false or cur[3] == ARGV[4]) then
  local fence = nowus
  local last = tonumber(redis.call('set', KEYS[2], string.format('%.0f', fence), 'get'))
  if last and last >= fence then
    fence = last + 1
    redis.call('set', KEYS[2], string.format('%.0f', fence))
  end
  local waiting = false
  if cur[3] or ARGV[7] == '1' then
    redis.call('zrem', KEYS[3], ARGV[4])
    redis.call('zrem', KEYS[4], ARGV[4])
    waiting = redis.call('zcard', KEYS[3]) > 0
    if cur[3] then
      redis.call('del', KEYS[1])
    end
  end
  local f = string.format('%.0f', fence)
  if waiting then
    redis.call('hset', KEYS[1], 'owner', ARGV[1], 'replica', ARGV[2], 'holds', 1, 'seq', 0, 'fence', f, 'waiting', '1')
  else
    redis.call('hset', KEYS[1], 'owner', ARGV[1], 'replica', ARGV[2], 'holds', 1, 'seq', 0, 'fence', f)
  end
  redis.call('pexpire', KEYS[1], ARGV[3])
  return {1, fence}
end
if ARGV[5] ~= '0' then
  local nowms = math.floor(nowus / 1000)
  redis.call('zadd', KEYS[3], 'NX', nowus, ARGV[4])
  redis.call('zadd', KEYS[4], nowms + tonumber(ARGV[5]), ARGV[4])
  redis.call('pexpire', KEYS[3], ARGV[6])
  redis.call('pexpire', KEYS[4], ARGV[6])
  if cur[1] then
    redis.call('hsetnx', KEYS[1], 'waiting', '1')
  end
end
return {0, redis.call('pttl', KEYS[1]), cur[4] or '', cur[3] or ''}
`)

// before18ReleaseScript: KEYS lock, queue, tickets, ended; ARGV token, fence (”:
// drop whatever term this token holds, leaving no ended marker: the
// clean-up of a lock nobody holds any more), ended ms, handoff ms, prefix,
// key. Ends the term: deletes the lock, marks the term ended, and if a
// contender queued during the term, reserves the lock for the oldest live
// waiting Locker and wakes it.
//
// Returns {1, Locker id or ”} when this call or an earlier send of it ended
// the term (the id is whom the lock is now reserved for), {0, ”} when the
// term no longer holds the lock (nothing is touched).
var before18ReleaseScript = redis.NewScript(before18HandoffLua + `
local cur = redis.call('hmget', KEYS[1], 'owner', 'fence', 'waiting')
if cur[1] ~= ARGV[1] or (ARGV[2] ~= '' and cur[2] ~= ARGV[2]) then
  if ARGV[2] ~= '' and redis.call('get', KEYS[4]) == ARGV[1] then
    return {1, ''}
  end
  return {0, ''}
end
if ARGV[2] ~= '' then
  redis.call('set', KEYS[4], ARGV[1], 'px', ARGV[3])
end
redis.call('del', KEYS[1])
if cur[3] then
  return {1, handoff(KEYS[1], KEYS[2], KEYS[3], ARGV[4], ARGV[5], ARGV[6]) or ''}
end
return {1, ''}
`)
