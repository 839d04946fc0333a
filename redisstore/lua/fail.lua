-- fail.lua: end a failed attempt: RELEASED (retryable) or FAILED (terminal,
-- or attempts exhausted).
--
-- KEYS[1]  the record (format: see acquire.lua)
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
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local ver, s, f, o, n, l, a, c, r = cmsgpack.unpack(v)
if ver ~= 1 then
  return redis.error_reply('idem: unknown record format')
end
local fence = tonumber(ARGV[2])
if (s == 'r' or s == 'f') and n == fence then
  return s
end
if s ~= 'p' or o ~= ARGV[1] or n ~= fence then
  return 0
end
local max = tonumber(ARGV[6])
local state, result = 'r', ''
if ARGV[5] == '1' or (max > 0 and a >= max) then
  state, result = 'f', ARGV[3]
end
redis.call('SET', KEYS[1], cmsgpack.pack(1, state, f, '', n, 0, a, c, result), 'PX', ARGV[4])
if ARGV[7] ~= '' then
  redis.call(ARGV[7], ARGV[8], state)
end
return state
