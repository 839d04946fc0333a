-- acquire.lua: take an idempotency key (DESIGN.md §1).
--
-- KEYS[1]  the record hash, <prefix>{<digest>}
-- ARGV[1]  fingerprint
-- ARGV[2]  owner token
-- ARGV[3]  lease, ms
-- ARGV[4]  retention, ms (for a record that becomes FAILED here)
-- ARGV[5]  max attempts (0: no limit)
-- ARGV[6]  time to live of an IN_PROGRESS record, ms: two leases plus
--          idem.InProgressGrace (computed in Go)
--
-- Reply, one of:
--   {1, fence, attempts}                  Acquired (also when the same owner
--                                         repeats a call whose reply was lost)
--   {2, fence, attempts, previous owner}  TakenOver (the lease had expired)
--   {3, µs left on the lease, attempts}   InProgress
--   {4, state, attempts, result}          Replay; state is 'c' or 'f'
--   {5}                                   Mismatch
--
-- Fields: s state (p in progress, c completed, r released, f failed),
-- f fingerprint, o owner, n fence, l lease end (µs), a attempts,
-- c created (µs; dropped on completion to save memory), r result. Times are
-- the server's (TIME), in µs. Numbers are formatted with %d: Lua numbers are
-- doubles, exact for integers below 2^53, which µs timestamps are.
local rec = redis.call('HMGET', KEYS[1], 's', 'f', 'o', 'n', 'l', 'a', 'r')
local s = rec[1]
if s and rec[2] ~= ARGV[1] then
  return {5}
end
if s == 'c' or s == 'f' then
  -- Replays, the most frequent duplicate, need neither the clock nor a write.
  return {4, s, tonumber(rec[6]), rec[7] or ''}
end
if s == 'p' and rec[3] == ARGV[2] then
  return {1, tonumber(rec[4]), tonumber(rec[6])}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local lease_ms = tonumber(ARGV[3])
local until_us = string.format('%d', now + lease_ms * 1000)
if not s then
  -- No record: the fence is seeded from the clock, so that it still grows
  -- after the record was deleted or expired.
  local fence = string.format('%d', now)
  redis.call('HSET', KEYS[1], 's', 'p', 'f', ARGV[1], 'o', ARGV[2],
    'n', fence, 'l', until_us, 'a', '1', 'c', fence)
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  return {1, now, 1}
end
local attempts = tonumber(rec[6])
if s == 'p' then
  local left = tonumber(rec[5]) - now
  if left > 0 then
    return {3, left, attempts}
  end
end
-- Released, or in progress with an expired lease.
local max = tonumber(ARGV[5])
if max > 0 and attempts >= max then
  redis.call('HSET', KEYS[1], 's', 'f')
  redis.call('HDEL', KEYS[1], 'o', 'l', 'r')
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {4, 'f', attempts, ''}
end
local fence = math.max(tonumber(rec[4]) + 1, now)
attempts = attempts + 1
redis.call('HSET', KEYS[1], 's', 'p', 'o', ARGV[2],
  'n', string.format('%d', fence), 'l', until_us, 'a', string.format('%d', attempts))
redis.call('PEXPIRE', KEYS[1], ARGV[6])
if s == 'p' then
  return {2, fence, attempts, rec[3]}
end
return {1, fence, attempts}
