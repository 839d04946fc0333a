-- complete.lua: store the result and move the record to COMPLETED.
--
-- KEYS[1]  the record hash
-- ARGV[1]  owner token
-- ARGV[2]  fence
-- ARGV[3]  result blob
-- ARGV[4]  retention, ms
-- ARGV[5]  notification command: PUBLISH, SPUBLISH, or '' for none
-- ARGV[6]  notification channel
--
-- The owner, the lease end and the creation time are dropped: a completed
-- record needs none of them, and memory per record counts.
--
-- Reply: 1 done (also when the same complete is repeated after a lost
-- reply), 0 lease lost.
local rec = redis.call('HMGET', KEYS[1], 's', 'o', 'n', 'r')
if rec[1] == 'c' and rec[3] == ARGV[2] and rec[4] == ARGV[3] then
  return 1
end
if rec[1] ~= 'p' or rec[2] ~= ARGV[1] or rec[3] ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 's', 'c', 'r', ARGV[3])
redis.call('HDEL', KEYS[1], 'o', 'l', 'c')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if ARGV[5] ~= '' then
  redis.call(ARGV[5], ARGV[6], 'c')
end
return 1
