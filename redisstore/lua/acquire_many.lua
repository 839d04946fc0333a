-- acquire_many.lua: take a batch of idempotency keys in one call, each as
-- acquire.lua would, in order (a key may repeat). The keys must be in one
-- hash slot on a Cluster (WithHashTag). acquire.lib.lua runs first.
--
-- KEYS[1..n]  the records
-- ARGV[1]     lease, ms
-- ARGV[2]     retention, ms
-- ARGV[3]     max attempts (0: no limit)
-- ARGV[4]     time to live of an IN_PROGRESS record, ms
-- ARGV[3+2i]  fingerprint of KEYS[i]
-- ARGV[4+2i]  owner token of KEYS[i]
--
-- Reply: an array with, for each key in order, acquire.lua's reply, the
-- fence alone (an integer) for a new record, or {0, message} for a record
-- in an unknown format (that key untouched).
local out = {}
for i = 1, #KEYS do
  local reply, err = acquire(KEYS[i], ARGV[3 + 2 * i], ARGV[4 + 2 * i], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
  out[i] = reply or {0, err}
end
return out
