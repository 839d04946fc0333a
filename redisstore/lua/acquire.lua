-- acquire.lua: take an idempotency key (docs/design.md#the-state-machine).
--
-- KEYS[1]  the record, <prefix>{<digest>}
-- ARGV[1]  fingerprint
-- ARGV[2]  owner token
-- ARGV[3]  lease, ms
-- ARGV[4]  time to live of an IN_PROGRESS record, ms: two leases plus
--          idem.InProgressGrace (computed in Go)
-- ARGV[5]  max attempts (optional: absent when there is no limit)
-- ARGV[6]  retention, ms, for a record that becomes FAILED here
--          (optional: only with ARGV[5])
--
-- The attempt limit comes last and only when there is one (the default has
-- none): Redis turns every argument into a Lua string in an ARGV table
-- that grows as it fills, and a new key's call with 4 arguments costs it
-- ~5% fewer instructions than with 6 (BENCHMARKS.md).
--
-- Reply, one of:
--   fence                                 Acquired a new record (attempts 1):
--                                         the most frequent reply, an integer
--                                         alone costs Redis less than a table
--   {1, fence, attempts}                  Acquired (also when the same owner
--                                         repeats a call whose reply was lost)
--   {2, fence, attempts, previous owner}  TakenOver (the lease had expired)
--   {3, µs left on the lease, attempts}   InProgress
--   {4, state, attempts, result}          Replay; state is 'c' or 'f'
--   {5}                                   Mismatch
--
-- The record is a string: the MessagePack values format version (1), state
-- (p in progress, c completed, r released, f failed), fingerprint, owner,
-- fence, lease end (µs), attempts, created, result; absent values are ''
-- or 0. SET ... PX writes it and its expiry in one call. Times are the
-- server's (TIME), in µs; Lua numbers are doubles, exact for integers below
-- 2^53, which µs timestamps are. created is written as an offset from the
-- fence, which is never earlier: created = fence + 1 + c, a negative c (-1,
-- one byte, for a key never taken again, whose fence is its creation time);
-- a positive c is the creation time in µs itself (records written before
-- the offset), 0 an unknown one (a record the relay wrote). The offset keeps
-- a completed record 8 bytes shorter than the time would.
local v = redis.call('GET', KEYS[1])
local ver, s, f, o, n, l, a, c, r
if v then
  ver, s, f, o, n, l, a, c, r = cmsgpack.unpack(v)
  if ver ~= 1 then
    return redis.error_reply('idem: unknown record format')
  end
  if f ~= ARGV[1] then
    return {5}
  end
  if s == 'c' or s == 'f' then
    -- Replays, the most frequent duplicate, need neither the clock nor a
    -- write.
    return {4, s, a, r}
  end
  if s == 'p' and o == ARGV[2] then
    return {1, n, a}
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local lease_end = now + tonumber(ARGV[3]) * 1000
if not v then
  -- No record: the fence is seeded from the clock, so that it still grows
  -- after the record was deleted or expired.
  redis.call('SET', KEYS[1], cmsgpack.pack(1, 'p', ARGV[1], ARGV[2], now, lease_end, 1, -1, ''), 'PX', ARGV[4])
  return now
end
if s == 'p' and l > now then
  return {3, l - now, a}
end
-- Released, or in progress with an expired lease.
local max = tonumber(ARGV[5] or 0)
if max > 0 and a >= max then
  redis.call('SET', KEYS[1], cmsgpack.pack(1, 'f', f, '', n, 0, a, c, ''), 'PX', ARGV[6])
  return {4, 'f', a, ''}
end
local fence = math.max(n + 1, now)
-- created, as an offset from the new fence
if c < 0 then
  c = c + n - fence
elseif c > 0 then
  c = c - fence - 1
end
redis.call('SET', KEYS[1], cmsgpack.pack(1, 'p', f, ARGV[2], fence, lease_end, a + 1, c, ''), 'PX', ARGV[4])
if s == 'p' then
  return {2, fence, a + 1, o}
end
return {1, fence, a + 1}
