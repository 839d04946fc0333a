-- complete.lua: store the result and move the record to COMPLETED. The
-- transition is in complete.lib.lua, which runs first.
--
-- KEYS[1]  the record (format: see acquire.lib.lua)
-- ARGV[1]  owner token
-- ARGV[2]  fence
-- ARGV[3]  result blob
-- ARGV[4]  retention, ms
-- ARGV[5]  notification command: PUBLISH, SPUBLISH, or '' for none
-- ARGV[6]  notification channel
--
-- Reply: 1 done (also when the same complete is repeated after a lost
-- reply), 0 lease lost, or an error for a record in an unknown format.
local done, err = complete(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if err then
  return redis.error_reply(err)
end
if done == 1 and ARGV[5] ~= '' then
  redis.call(ARGV[5], ARGV[6], 'c')
end
if done == 0 then
  return 0
end
return 1
