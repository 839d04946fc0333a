-- release.lua: give the key back without storing anything (RELEASED).
--
-- KEYS[1]  the record (format: see acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  fence
-- ARGV[3]  retention, ms
-- ARGV[4]  notification command: PUBLISH, SPUBLISH, or ''
-- ARGV[5]  notification channel
--
-- Reply: 1 released (also for a repeated call), 0 lease lost.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local ver, s, f, o, n, l, a, c, r = cmsgpack.unpack(v)
if ver ~= 1 then
  return redis.error_reply('idem: unknown record format')
end
local fence = tonumber(ARGV[2])
if s == 'r' and n == fence then
  return 1
end
if s ~= 'p' or o ~= ARGV[1] or n ~= fence then
  return 0
end
redis.call('SET', KEYS[1], cmsgpack.pack(1, 'r', f, '', n, 0, a, c, ''), 'PX', ARGV[3])
if ARGV[4] ~= '' then
  redis.call(ARGV[4], ARGV[5], 'r')
end
return 1
