-- complete_ack.lua: store the result, move the record to COMPLETED and
-- acknowledge the stream entry that carried the work, in one script, so
-- that no crash can fall between completing and acknowledging. The
-- transition is in complete.lib.lua, which runs first.
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
-- The XACK comes after the only write that can be refused, so a refused
-- complete acks nothing.
--
-- Reply: 1 done and acknowledged (also when the same call is repeated after
-- a lost reply), 0 lease lost (nothing written, nothing acknowledged), or an
-- error for a record in an unknown format.
local done, err = complete(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if err then
  return redis.error_reply(err)
end
if done == 0 then
  return 0
end
redis.call('XACK', KEYS[2], ARGV[7], ARGV[8])
if done == 1 and ARGV[5] ~= '' then
  redis.call(ARGV[5], ARGV[6], 'c')
end
return 1
