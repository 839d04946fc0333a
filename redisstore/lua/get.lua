-- get.lua: read a record with the server's clock.
--
-- KEYS[1]  the record (format: see acquire.lua)
--
-- Reply: {now µs, ttl ms, state, fingerprint, owner, fence, lease end µs,
-- attempts, created µs, result}; the state is '' when there is no record.
-- ttl is -1 when the record has no expiry, -2 when there is no record.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local v = redis.call('GET', KEYS[1])
if not v then
  return {now, -2, '', '', '', 0, 0, 0, 0, ''}
end
local ver, s, f, o, n, l, a, c, r = cmsgpack.unpack(v)
if ver ~= 1 then
  return redis.error_reply('idem: unknown record format')
end
if c < 0 then
  c = n + 1 + c -- an offset from the fence (see acquire.lua)
end
return {now, redis.call('PTTL', KEYS[1]), s, f, o, n, l, a, c, r}
