-- extend.lua: extend the owner's lease to end a given time from now.
--
-- KEYS[1]  the record hash
-- ARGV[1]  owner token
-- ARGV[2]  fence
-- ARGV[3]  lease, ms
-- ARGV[4]  time to live of the record, ms (two leases plus the grace)
--
-- Reply: 1 extended, 0 lease lost. Expiry alone does not lose a lease: an
-- expired lease that nobody took over is extended.
local rec = redis.call('HMGET', KEYS[1], 's', 'o', 'n')
if rec[1] ~= 'p' or rec[2] ~= ARGV[1] or rec[3] ~= ARGV[2] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local lease_ms = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'l', string.format('%d', now + lease_ms * 1000))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
