package redislock

import (
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Keys of one lock key K (all share the hash tag {K}, so every script runs
// in one cluster slot):
//
//	<prefix>:{K}:lock     hash, PTTL = the lease's TTL:
//	                        owner    the term's token (replica id + random, unique per Acquire)
//	                        replica  the replica id, shown to contenders and in `coordinator locks`
//	                        holds    the hold count (reentrant acquisitions), as the holder last set it;
//	                                 absent until a reentry sets it: 1
//	                        seq      the holder's operation number that set holds (per term); absent: 0
//	                        fence    the term's fencing token
//	                        waiting  '1' once a contender queued during this term: only then
//	                                 does the release look at the queue and hand off
//	                        reserved '' when the term began by taking a reservation (below):
//	                                 the hash was reused, see handoffLua; '' is no reservation
//	                      or, for handoffMS after a release, only {reserved: Locker id}: the
//	                      lock is kept for the oldest live waiting Locker (no owner, so no
//	                      script mistakes it for a held lock)
//	<prefix>:{K}:fence    string, no TTL: the last fence handed out
//	<prefix>:{K}:queue    zset: waiting Locker id -> arrival (Redis time, µs); FIFO order
//	<prefix>:{K}:tickets  zset: waiting Locker id -> ticket expiry (Redis time, ms)
//	<prefix>:{K}:ended:F  string, PTTL endedMS: the token that released term F (fence F),
//	                      so that a resent release answers "released", not "not held"
//
// and one channel per Locker, <prefix>:wake:<Locker id>: a release that hands
// the lock to a waiting Locker publishes "K" there, and only that Locker wakes.
//
// Every script is safe to run twice (go-redis resends a command whose reply
// timed out, and the first send may still have run): acquire recognises its
// own token, holds carries the desired count with an operation number
// instead of an increment, release recognises a term it already ended, and
// renew and leave only set what is already set.
//
// Fences: fence = max(last fence + 1, Redis TIME in µs), so they rise per
// key also when the fence key is gone (FLUSHALL, a restart without
// persistence, a failover to a replica that missed it), as long as the
// Redis host's clock does not step back past the last fence. They are large
// numbers (~1.8e15 in 2026): int64 everywhere, and below 2^53 until the
// year 2255, so exact in JSON readers that use doubles.

// Cost. Every redis.call from Lua costs well above its command (argument
// conversion, command lookup, the reply parsed back into Lua values), and
// Lua's number formatting goes through glibc's printf_fp: a
// string.format('%.0f') of a fence cost more instructions than the SET that
// stores it (measured with callgrind, bench/notes/ownership.md). So the
// uncontended path of acquire and release makes the fewest calls the
// guarantees allow (acquire: HMGET, TIME, SET fence GET, HSET, PEXPIRE;
// release: HMGET, SET ended marker, DEL), builds the fence from TIME's two
// strings without a number conversion, compares fences as digit strings
// (and adds 1 on the digits in the rare case the clock did not move past
// the last fence),
// returns the fence as a string, writes no holds or seq field until a
// reentry needs one, and takes its constants from the script text rather
// than as arguments.

// scriptText puts the Go constants the scripts use into their text.
func scriptText(src string) string {
	return strings.NewReplacer(
		"HANDOFF_MS", strconv.Itoa(handoffMS),
		"ENDED_MS", strconv.Itoa(endedMS),
		"QUEUE_MS", strconv.FormatInt(queueMS, 10),
	).Replace(src)
}

// handoffLua reserves the lock KEYS[1] (its queue and tickets keys are
// KEYS[2] and KEYS[3]) for the oldest live waiting Locker (ticket not
// expired) for HANDOFF_MS and publishes the key on that Locker's wake
// channel. Expired tickets are dropped, and so is the Locker gone (false:
// none), which stops waiting. The prefix and the key are read back from the
// lock key's name (<prefix>:{K}:lock; the prefix has no braces). Returns the
// Locker id, or false when nobody waits. The lock hash is deleted (release)
// or holds only a reservation (leave, which passes on its own: then, with
// nobody waiting, it is deleted here).
//
// Migrations. On the master a slot is migrating away from, a script runs
// only while all its keys are there, and a command on a key that is not
// (one it deleted itself, a zset its ZREM emptied) fails the script half-way
// ("non local key"). So the head is picked before any ZREM, and a lock hash
// that goes on is reused rather than deleted and made again. (The release
// declares its ended marker, which never exists before it runs: it never
// runs there, but is sent again until the slot has moved; see send.go.)
const handoffLua = `
local function handoff(gone)
  local lock, queue, tickets = KEYS[1], KEYS[2], KEYS[3]
  local t = redis.call('time')
  local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local dead = redis.call('zrangebyscore', tickets, '-inf', nowms)
  if gone then
    dead[#dead + 1] = gone
  end
  local head
  if #dead == 0 then
    head = redis.call('zrange', queue, 0, 0)[1]
  else
    local isdead = {}
    for _, d in ipairs(dead) do
      isdead[d] = true
    end
    for _, w in ipairs(redis.call('zrange', queue, 0, #dead)) do
      if not isdead[w] then
        head = w
        break
      end
    end
    redis.call('zrem', queue, unpack(dead))
    redis.call('zrem', tickets, unpack(dead))
  end
  if head then
    local prefix, key = string.match(lock, '^(.-):{(.*)}:lock$')
    redis.call('hset', lock, 'reserved', head)
    redis.call('pexpire', lock, HANDOFF_MS)
    redis.call('publish', prefix .. ':wake:' .. head, key)
    return head
  end
  if gone then
    redis.call('del', lock)
  end
  return false
end
`

// fenceLua: the fence of a new term, max(last + 1, Redis TIME in µs), as a
// decimal string, stored in the fence key (KEYS[2]). TIME's microseconds
// are zero-padded to six digits by string operations; two fences (digits,
// no leading zeros) compare by length, then as strings, and last + 1 is
// added on the digits, so it is exact at any size (a Lua number, a double,
// is not above 2^53). A fence key that does not hold digits is
// overwritten, as before.
const fenceLua = `
local function newfence()
  local t = redis.call('time')
  local f = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
  local last = redis.call('set', KEYS[2], f, 'get')
  if last and (#last > #f or (#last == #f and last >= f)) and string.find(last, '^[1-9]%d*$') then
    local i = #last
    while string.byte(last, i) == 57 do
      i = i - 1
    end
    if i == 0 then
      f = '1' .. string.rep('0', #last)
    else
      f = string.sub(last, 1, i - 1) .. string.char(string.byte(last, i) + 1) .. string.rep('0', #last - i)
    end
    redis.call('set', KEYS[2], f)
  end
  return f
end
`

// acquireScript: KEYS lock, fence, queue, tickets; ARGV token, replica, ttl
// ms, ticket: the queue ticket's ms (0: do not queue), with a leading '+'
// when this Locker may have a queue entry. The Locker id is the token up to
// its last ':'. The queue keys' PTTL is QUEUE_MS (at least any ticket).
//
// Returns the fence (a decimal string, not a table: cheaper to build and to
// send) when acquired, also when this very token already holds it (a
// resend: the TTL is set again, nothing else changes). Otherwise
// {0, pttl, replica, reserved}: the lock is held
// (replica is the holder's) or reserved for another waiting Locker (replica
// ”, reserved its id); the caller's Locker is queued (or its ticket
// renewed; its place is kept).
var acquireScript = redis.NewScript(acquireLua)

var acquireLua = scriptText(fenceLua + `
local cur = redis.call('hmget', KEYS[1], 'owner', 'reserved')
if cur[1] == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[3])
  return redis.call('hget', KEYS[1], 'fence')
end
if cur[2] == '' then
  cur[2] = false
end
local queued = string.byte(ARGV[4]) == 43
local id
if cur[2] or queued or (cur[1] and ARGV[4] ~= '0') then
  id = string.match(ARGV[1], '^(.*):')
end
if cur[1] == false and (cur[2] == false or cur[2] == id) then
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
end
return {0, redis.call('pttl', KEYS[1]), replica, cur[2] or ''}
`)

// holdsScript: KEYS lock; ARGV token, fence, holds, seq. Sets the hold
// count a reentry or a release that is not the last one leaves, unless an
// operation with a higher seq already set it (a late resend). Returns
// {1, ”} when the term still holds the lock, else {0, replica of the
// current holder or ”} (nothing is touched).
var holdsScript = redis.NewScript(`
local cur = redis.call('hmget', KEYS[1], 'owner', 'fence', 'seq', 'replica')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then
  return {0, cur[4] or ''}
end
if tonumber(ARGV[4]) > (tonumber(cur[3]) or 0) then
  redis.call('hset', KEYS[1], 'holds', ARGV[3], 'seq', ARGV[4])
end
return {1, ''}
`)

// releaseScript: KEYS lock, queue, tickets, ended; ARGV token, fence (”:
// drop whatever term this token holds, leaving no ended marker: the
// clean-up of a lock nobody holds any more). Ends the term: marks it ended
// for ENDED_MS and deletes the lock, and if a contender queued during the
// term, reserves it for the oldest live waiting Locker and wakes it.
//
// Returns 1 when this call or an earlier send of it ended the term (or the
// Locker id the lock is now reserved for, when this call handed it off), 0
// when the term no longer holds the lock (nothing is touched).
var releaseScript = redis.NewScript(releaseLua)

var releaseLua = scriptText(handoffLua + `
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
if cur[3] then
  return handoff(false) or 1
end
return 1
`)

// leaveScript: KEYS lock, queue, tickets; ARGV Locker id. The
// Locker stops waiting for the key: its queue entry goes, and a reservation
// made for it passes to the next live waiting Locker (or is dropped).
// Returns the Locker id the lock is now reserved for, or ”.
var leaveScript = redis.NewScript(scriptText(handoffLua + `
local cur = redis.call('hmget', KEYS[1], 'owner', 'reserved')
if cur[1] == false and cur[2] == ARGV[1] then
  return handoff(ARGV[1]) or ''
end
redis.call('zrem', KEYS[2], ARGV[1])
redis.call('zrem', KEYS[3], ARGV[1])
return ''
`))

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
