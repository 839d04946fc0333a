-- complete.lua: store the result and move the record to COMPLETED.
--
-- KEYS[1]  the record (format: see acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  fence
-- ARGV[3]  result blob
-- ARGV[4]  retention, ms
-- ARGV[5]  notification command: PUBLISH, SPUBLISH, or '' for none
-- ARGV[6]  notification channel
--
-- The owner and the lease end are dropped: a completed record needs neither,
-- and memory per record counts. The creation time stays (idem get and ls
-- show a record's age), as its offset from the fence, which completion
-- keeps.
--
-- Reply: 1 done (also when the same complete is repeated after a lost
-- reply), 0 lease lost.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local ver, s, f, o, n, l, a, c, r = cmsgpack.unpack(v)
if ver ~= 1 then
  return redis.error_reply('idem: unknown record format')
end
local fence = tonumber(ARGV[2])
if s == 'c' and n == fence and r == ARGV[3] then
  return 1
end
if s ~= 'p' or o ~= ARGV[1] or n ~= fence then
  return 0
end
redis.call('SET', KEYS[1], cmsgpack.pack(1, 'c', f, '', n, 0, a, c, ARGV[3]), 'PX', ARGV[4])
if ARGV[5] ~= '' then
  redis.call(ARGV[5], ARGV[6], 'c')
end
return 1
