-- get.lua: read a record with the server's clock.
--
-- KEYS[1]  the record hash
--
-- Reply: {now µs, ttl ms, state, fingerprint, owner, fence, lease end µs,
-- attempts, created µs, result}; absent fields are '' (a Lua table cannot
-- hold nil), so the state is '' when there is no record. ttl is -1 when the
-- record has no expiry, -2 when there is no record.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rec = redis.call('HMGET', KEYS[1], 's', 'f', 'o', 'n', 'l', 'a', 'c', 'r')
local out = {now, redis.call('PTTL', KEYS[1])}
for i = 1, 8 do
  out[i + 2] = rec[i] or ''
end
return out
