-- complete_many.lua: complete.lua for a batch of records in one call, in
-- order. The records must be in one hash slot on a Cluster (WithHashTag).
-- complete.lib.lua runs first.
--
-- KEYS[1..n]   the records; record KEYS[i] notifies channel KEYS[i]..':w'
-- ARGV[1]      retention, ms
-- ARGV[2]      notification command: PUBLISH, SPUBLISH, or '' for none
-- ARGV[3i]     owner token of KEYS[i]
-- ARGV[3i+1]   fence of KEYS[i]
-- ARGV[3i+2]   result blob of KEYS[i]
--
-- Reply: an array with, for each record in order, 1 done (also for a
-- repeated call), 0 lease lost, or an error message for a record in an
-- unknown format.
local out = {}
for i = 1, #KEYS do
  local at = 3 * i
  local done, err = complete(KEYS[i], ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[1])
  if err then
    out[i] = err
  else
    out[i] = math.min(done, 1)
    if done == 1 and ARGV[2] ~= '' then
      redis.call(ARGV[2], KEYS[i] .. ':w', 'c')
    end
  end
end
return out
