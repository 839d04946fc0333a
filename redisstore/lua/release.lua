-- release.lua: give the key back without storing anything (RELEASED).
--
-- KEYS[1]  the record hash
-- ARGV[1]  owner token
-- ARGV[2]  fence
-- ARGV[3]  retention, ms
-- ARGV[4]  notification command: PUBLISH, SPUBLISH, or ''
-- ARGV[5]  notification channel
--
-- Reply: 1 released (also for a repeated call), 0 lease lost.
local rec = redis.call('HMGET', KEYS[1], 's', 'o', 'n')
if rec[1] == 'r' and rec[3] == ARGV[2] then
  return 1
end
if rec[1] ~= 'p' or rec[2] ~= ARGV[1] or rec[3] ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 's', 'r')
redis.call('HDEL', KEYS[1], 'o', 'l')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if ARGV[4] ~= '' then
  redis.call(ARGV[4], ARGV[5], 'r')
end
return 1
