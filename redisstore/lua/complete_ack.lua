-- complete_ack.lua: store the result, move the record to COMPLETED and
-- acknowledge the stream entry that carried the work, in one script, so
-- that no crash can fall between completing and acknowledging.
--
-- KEYS[1]  the record (format: see acquire.lua)
-- KEYS[2]  the stream; it shares the record's hash tag (WithHashTag)
-- ARGV[1]  owner token
-- ARGV[2]  fence
-- ARGV[3]  result blob
-- ARGV[4]  retention, ms
-- ARGV[5]  notification command: PUBLISH, SPUBLISH, or '' for none
-- ARGV[6]  notification channel
-- ARGV[7]  consumer group
-- ARGV[8]  stream entry ID
--
-- The checks and the write are those of complete.lua; the XACK comes after
-- the only write that can be refused, so a refused complete acks nothing.
--
-- Reply: 1 done and acknowledged (also when the same call is repeated after
-- a lost reply), 0 lease lost (nothing written, nothing acknowledged).
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
  redis.call('XACK', KEYS[2], ARGV[7], ARGV[8])
  return 1
end
if s ~= 'p' or o ~= ARGV[1] or n ~= fence then
  return 0
end
redis.call('SET', KEYS[1], cmsgpack.pack(1, 'c', f, '', n, 0, a, 0, ARGV[3]), 'PX', ARGV[4])
redis.call('XACK', KEYS[2], ARGV[7], ARGV[8])
if ARGV[5] ~= '' then
  redis.call(ARGV[5], ARGV[6], 'c')
end
return 1
