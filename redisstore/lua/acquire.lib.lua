-- acquire.lib.lua: the acquire transition (docs/design.md#the-state-machine)
-- as a function, for acquire_many.lua (a batch of keys in one slot), to
-- which scripts.go prepends it; it is not a script by itself. acquire.lua,
-- the hot path, carries the same transition inline (see scripts.go): change
-- both.
--
-- The record is a string: the MessagePack values format version (1), state
-- (p in progress, c completed, r released, f failed), fingerprint, owner,
-- fence, lease end (µs), attempts, created, result; absent values are ''
-- or 0. SET ... PX writes it and its expiry in one call. Times are the
-- server's (TIME), in µs; Lua numbers are doubles, exact for integers below
-- 2^53, which µs timestamps are. created is an offset from the fence (see
-- acquire.lua).

-- clock returns the server's time in µs, read with TIME at most once per
-- script call.
local now_us
local function clock()
  if not now_us then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now_us
end

-- acquire takes the record at key. fp, owner, lease_ms, retention_ms,
-- max_attempts and ttl_ms are acquire.lua's ARGV[1] to ARGV[6], as strings.
-- It returns acquire.lua's reply, except for a new record, the common case
-- of a batch, for which it returns the fence alone (an integer, short for
-- {1, fence, 1}: a nested reply costs Redis more per key); or nil and an
-- error message.
local function acquire(key, fp, owner, lease_ms, retention_ms, max_attempts, ttl_ms)
  local now = clock()
  local lease_end = now + tonumber(lease_ms) * 1000
  -- The new record is written if there is none (NX), and an existing one is
  -- read (GET), in one call: a batch is mostly new keys. With no record,
  -- the fence is seeded from the clock, so that it still grows after the
  -- record was deleted or expired.
  local v = redis.call('SET', key, cmsgpack.pack(1, 'p', fp, owner, now, lease_end, 1, -1, ''), 'NX', 'GET', 'PX', ttl_ms)
  if not v then
    return now
  end
  local ver, s, f, o, n, l, a, c, r = cmsgpack.unpack(v)
  if ver ~= 1 then
    return nil, 'idem: unknown record format'
  end
  if f ~= fp then
    return {5}
  end
  if s == 'c' or s == 'f' then
    return {4, s, a, r}
  end
  if s == 'p' and o == owner then
    return {1, n, a}
  end
  if s == 'p' and l > now then
    return {3, l - now, a}
  end
  -- Released, or in progress with an expired lease.
  local max = tonumber(max_attempts)
  if max > 0 and a >= max then
    redis.call('SET', key, cmsgpack.pack(1, 'f', f, '', n, 0, a, c, ''), 'PX', retention_ms)
    return {4, 'f', a, ''}
  end
  local fence = math.max(n + 1, now)
  -- created, as an offset from the new fence
  if c < 0 then
    c = c + n - fence
  elseif c > 0 then
    c = c - fence - 1
  end
  redis.call('SET', key, cmsgpack.pack(1, 'p', f, owner, fence, lease_end, a + 1, c, ''), 'PX', ttl_ms)
  if s == 'p' then
    return {2, fence, a + 1, o}
  end
  return {1, fence, a + 1}
end
