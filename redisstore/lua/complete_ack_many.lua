-- complete_ack_many.lua: complete_ack.lua for a batch of records of one
-- stream in one call: each record is completed as complete.lua would, in
-- order, and the entries of the completed ones are acknowledged with XACK.
-- The records and the stream must be in one hash slot on a Cluster
-- (WithHashTag). complete.lib.lua runs first.
--
-- KEYS[1]        the stream
-- KEYS[2..n+1]   the records; record KEYS[i+1] notifies channel KEYS[i+1]..':w'
-- ARGV[1]        retention, ms
-- ARGV[2]        notification command: PUBLISH, SPUBLISH, or '' for none
-- ARGV[3]        consumer group
-- ARGV[4i]       owner token of record i
-- ARGV[4i+1]     fence of record i
-- ARGV[4i+2]     result blob of record i
-- ARGV[4i+3]     stream entry ID of record i
--
-- Reply: an array with, for each record in order, 1 done and acknowledged
-- (also for a repeated call), 0 lease lost (nothing written, not
-- acknowledged), or an error message for a record in an unknown format.
local out, ids = {}, {}
for i = 1, #KEYS - 1 do
  local key, at = KEYS[i + 1], 4 * i
  local done, err = complete(key, ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[1])
  if err then
    out[i] = err
  elseif done == 0 then
    out[i] = 0
  else
    out[i] = 1
    ids[#ids + 1] = ARGV[at + 3]
    if done == 1 and ARGV[2] ~= '' then
      redis.call(ARGV[2], key .. ':w', 'c')
    end
  end
end
-- XACK in chunks: unpack has a limit on the number of values.
for lo = 1, #ids, 1000 do
  redis.call('XACK', KEYS[1], ARGV[3], unpack(ids, lo, math.min(lo + 999, #ids)))
end
return out
