-- fail.lua: end a failed attempt: RELEASED (retryable) or FAILED (terminal,
-- or attempts exhausted).
--
-- KEYS[1]  the record hash
-- ARGV[1]  owner token
-- ARGV[2]  fence
-- ARGV[3]  result blob, stored if the record becomes FAILED
-- ARGV[4]  retention, ms
-- ARGV[5]  1 terminal, 0 retryable
-- ARGV[6]  max attempts (0: no limit)
-- ARGV[7]  notification command: PUBLISH, SPUBLISH, or ''
-- ARGV[8]  notification channel
--
-- Reply: 'r' released, 'f' failed, 0 lease lost. A repeated call whose reply
-- was lost gets the state its first call set.
local rec = redis.call('HMGET', KEYS[1], 's', 'o', 'n', 'a')
if (rec[1] == 'r' or rec[1] == 'f') and rec[3] == ARGV[2] then
  return rec[1]
end
if rec[1] ~= 'p' or rec[2] ~= ARGV[1] or rec[3] ~= ARGV[2] then
  return 0
end
local max = tonumber(ARGV[6])
local state = 'r'
if ARGV[5] == '1' or (max > 0 and tonumber(rec[4]) >= max) then
  state = 'f'
  redis.call('HSET', KEYS[1], 's', 'f', 'r', ARGV[3])
else
  redis.call('HSET', KEYS[1], 's', 'r')
end
redis.call('HDEL', KEYS[1], 'o', 'l')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if ARGV[7] ~= '' then
  redis.call(ARGV[7], ARGV[8], state)
end
return state
