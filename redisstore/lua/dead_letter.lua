-- dead_letter.lua: copy a pending stream entry to the dead-letter stream and
-- acknowledge it, in one script.
--
-- KEYS[1]  the stream
-- KEYS[2]  the dead-letter stream (same hash tag as the stream)
-- ARGV[1]  consumer group
-- ARGV[2]  stream entry ID
-- ARGV[3…] field, value, field, value, … of the dead-letter entry
--
-- Only an entry that is still pending in the group is copied, so that two
-- consumers that both dead-letter it (one of them after a claim) add one
-- entry. The XADD comes before the XACK: if it fails, nothing is
-- acknowledged.
--
-- Reply: 1 copied and acknowledged, 0 not pending (nothing done).
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #p == 0 then
  return 0
end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return 1
