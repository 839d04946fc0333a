-- extend.lua: extend the owner's lease to end a given time from now.
--
-- KEYS[1]  the record (format: see acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  fence
-- ARGV[3]  lease, ms
-- ARGV[4]  time to live of the record, ms (two leases plus the grace)
--
-- Reply: 1 extended, 0 lease lost. Expiry alone does not lose a lease: an
-- expired lease that nobody took over is extended.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local ver, s, f, o, n, l, a, c, r = cmsgpack.unpack(v)
if ver ~= 1 then
  return redis.error_reply('idem: unknown record format')
end
if s ~= 'p' or o ~= ARGV[1] or n ~= tonumber(ARGV[2]) then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('SET', KEYS[1], cmsgpack.pack(1, s, f, o, n, now + tonumber(ARGV[3]) * 1000, a, c, r), 'PX', ARGV[4])
return 1
