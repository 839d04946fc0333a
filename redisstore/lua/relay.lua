-- relay.lua: record a completion that committed elsewhere (the Postgres
-- commit gate's completion row; idem.Relayer).
--
-- KEYS[1]  the record (format: see acquire.lua)
-- ARGV[1]  fingerprint of the committed request
-- ARGV[2]  fence of the committed attempt
-- ARGV[3]  result blob
-- ARGV[4]  retention, ms
-- ARGV[5]  notification command: PUBLISH, SPUBLISH, or '' for none
-- ARGV[6]  notification channel
--
-- The record becomes COMPLETED with the result whatever its state and
-- owner; a COMPLETED record is never changed (the first completion stays).
-- It keeps the higher of its fence and ARGV[2], and its attempts (1 for a
-- new record).
--
-- Reply: 1 written, 2 already COMPLETED (nothing written).
local v = redis.call('GET', KEYS[1])
local fence = tonumber(ARGV[2])
local a = 1
if v then
  local ver, s, f, o, n, l, at, c, r = cmsgpack.unpack(v)
  if ver ~= 1 then
    return redis.error_reply('idem: unknown record format')
  end
  if s == 'c' then
    return 2
  end
  fence = math.max(n, fence)
  a = at
end
redis.call('SET', KEYS[1], cmsgpack.pack(1, 'c', ARGV[1], '', fence, 0, a, 0, ARGV[3]), 'PX', ARGV[4])
if ARGV[5] ~= '' then
  redis.call(ARGV[5], ARGV[6], 'c')
end
return 1
