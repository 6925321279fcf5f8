package redislock

import "github.com/redis/go-redis/v9"

// The scripts of the redisson layout (Config.Layout = LayoutRedisson).
//
// The lock is the Redisson lock name K itself. Redisson's RLock keeps K as
// a hash {"<client id>:<thread id>": hold count} with a PTTL, takes it only
// when K does not exist or has its own field, renews and releases only its
// own field, and on its last unlock deletes K and publishes 0 on
// redisson_lock__channel:{K}. So:
//
//   - a coordinator term writes its fields (owner, replica, fence, waiting,
//     holds, seq; scripts.go) into K. K exists, no Redisson field is in it:
//     every Redisson client sees K held (and waits its PTTL, or for the
//     channel);
//   - a K that exists with neither an owner nor a reserved field is held by
//     someone else: a Redisson client (its field names it), or another
//     Redisson object on the same name. The coordinator waits, as for any
//     holder, and never writes into it;
//   - the coordinator's release, and the clean-up of a lock nobody holds,
//     delete K and publish Redisson's unlock message on its channel (and
//     with SPUBLISH too on a cluster, where Redisson subscribes to sharded
//     channels), so that a Redisson waiter tries again at once;
//   - a hand-off to a waiting Locker keeps K as {reserved: Locker id} for
//     HANDOFF_MS: Redisson sees it held for that long.
//
// The renew, holds and ttl scripts (scripts.go, ttl.go) only read and
// write the coordinator's fields of the lock key they are given, and work
// unchanged on K. The fence, queue, tickets and ended keys are the
// coordinator layout's (P:{K}:...), in K's slot.

// handoffRedissonLua reserves K (KEYS[1]) for the oldest live waiting
// Locker, as handoffLua does, and wakes it on <wake prefix><Locker id>.
const handoffRedissonLua = `
local function handoff(wake)
  local queue, tickets = KEYS[2], KEYS[3]
  local t = redis.call('time')
  local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local dead = redis.call('zrangebyscore', tickets, '-inf', nowms)
  if #dead > 0 then
    redis.call('zrem', queue, unpack(dead))
    redis.call('zrem', tickets, unpack(dead))
  end
  local head = redis.call('zrange', queue, 0, 0)[1]
  if head then
    redis.call('hset', KEYS[1], 'reserved', head)
    redis.call('pexpire', KEYS[1], HANDOFF_MS)
    redis.call('publish', wake .. head, KEYS[1])
    return head
  end
  return false
end
`

// unlockedLua publishes Redisson's unlock message on its channel of K:
// PUBLISH, and SPUBLISH too on a cluster (sharded == '1'). SPUBLISH goes
// through pcall: a Redis before 7 has none, and its Redisson clients
// subscribe with SUBSCRIBE anyway.
const unlockedLua = `
local function unlocked(channel, sharded)
  redis.call('publish', channel, '0')
  if sharded == '1' then
    redis.pcall('spublish', channel, '0')
  end
end
`

// acquireRedissonScript: as acquireScript (same KEYS and ARGV), on K. A K
// that exists without an owner or a reserved field is held by someone
// else: the caller queues, and the answer names the holder as
// redisson:<its first field> (Redisson's <client id>:<thread id>). Like
// acquireScript it may run on the master a slot is migrating away from, so
// it takes a reservation by reusing K (reserved set to the empty string) and counts the
// queue before leaving it (handoffLua says why). The release and leave
// scripts of this layout declare Redisson's channel of K among their keys,
// which never exists: during a migration they get TRYAGAIN until it ends,
// and never run there.
var acquireRedissonScript = redis.NewScript(scriptText(fenceLua + `
local cur = redis.call('hmget', KEYS[1], 'owner', 'reserved')
if cur[1] == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[3])
  return redis.call('hget', KEYS[1], 'fence')
end
if cur[2] == '' then
  cur[2] = false
end
local foreign = cur[1] == false and cur[2] == false and redis.call('exists', KEYS[1]) == 1
local queued = string.byte(ARGV[4]) == 43
local id
if cur[2] or queued or ((cur[1] or foreign) and ARGV[4] ~= '0') then
  id = string.match(ARGV[1], '^(.*):')
end
if not foreign and cur[1] == false and (cur[2] == false or cur[2] == id) then
  local f = newfence()
  local waiting = false
  if cur[2] or queued then
    local n = redis.call('zcard', KEYS[3])
    n = n - redis.call('zrem', KEYS[3], id)
    redis.call('zrem', KEYS[4], id)
    waiting = n > 0
  end
  if waiting or cur[2] then
    local h = {'owner', ARGV[1], 'replica', ARGV[2], 'fence', f}
    if waiting then
      h[#h + 1], h[#h + 2] = 'waiting', '1'
    end
    if cur[2] then
      h[#h + 1], h[#h + 2] = 'reserved', ''
    end
    redis.call('hset', KEYS[1], unpack(h))
  else
    redis.call('hset', KEYS[1], 'owner', ARGV[1], 'replica', ARGV[2], 'fence', f)
  end
  redis.call('pexpire', KEYS[1], ARGV[3])
  return f
end
local ticket = tonumber(ARGV[4])
if ticket > 0 then
  local t = redis.call('time')
  local nowus = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local nowms = math.floor(nowus / 1000)
  redis.call('zadd', KEYS[3], 'NX', nowus, id)
  redis.call('zadd', KEYS[4], nowms + ticket, id)
  redis.call('pexpire', KEYS[3], QUEUE_MS)
  redis.call('pexpire', KEYS[4], QUEUE_MS)
  if cur[1] then
    redis.call('hsetnx', KEYS[1], 'waiting', '1')
  end
end
local replica = ''
if cur[1] then
  replica = redis.call('hget', KEYS[1], 'replica') or ''
elseif foreign then
  replica = 'redisson:' .. (redis.call('hkeys', KEYS[1])[1] or '')
end
return {0, redis.call('pttl', KEYS[1]), replica, cur[2] or ''}
`))

// releaseRedissonScript: KEYS K, queue, tickets, ended, Redisson's channel
// of K; ARGV token, fence (” as in releaseScript), wake channel prefix,
// sharded ('1' on a cluster). As releaseScript, and every delete of K
// publishes Redisson's unlock message. Returns as releaseScript.
var releaseRedissonScript = redis.NewScript(scriptText(handoffRedissonLua + unlockedLua + `
local cur = redis.call('hmget', KEYS[1], 'owner', 'fence', 'waiting')
if cur[1] ~= ARGV[1] or (ARGV[2] ~= '' and cur[2] ~= ARGV[2]) then
  if ARGV[2] ~= '' and redis.call('get', KEYS[4]) == ARGV[1] then
    return 1
  end
  return 0
end
if ARGV[2] ~= '' then
  redis.call('set', KEYS[4], ARGV[1], 'px', ENDED_MS)
end
redis.call('del', KEYS[1])
local r = 1
if cur[3] then
  r = handoff(ARGV[3]) or 1
end
unlocked(KEYS[5], ARGV[4])
return r
`))

// leaveRedissonScript: KEYS K, queue, tickets, Redisson's channel of K;
// ARGV Locker id, wake channel prefix, sharded. As leaveScript; when the
// reservation it drops leaves K free, Redisson's waiters are told.
var leaveRedissonScript = redis.NewScript(scriptText(handoffRedissonLua + unlockedLua + `
redis.call('zrem', KEYS[2], ARGV[1])
redis.call('zrem', KEYS[3], ARGV[1])
local cur = redis.call('hmget', KEYS[1], 'owner', 'reserved')
if cur[1] == false and cur[2] == ARGV[1] then
  redis.call('del', KEYS[1])
  local head = handoff(ARGV[2])
  if head then
    return head
  end
  unlocked(KEYS[4], ARGV[3])
end
return ''
`))
