-- acquire.lua: take an idempotency key (DESIGN.md §1). The transition and
-- the record format are in acquire.lib.lua, which runs first.
--
-- KEYS[1]  the record, <prefix>{<digest>}
-- ARGV[1]  fingerprint
-- ARGV[2]  owner token
-- ARGV[3]  lease, ms
-- ARGV[4]  retention, ms (for a record that becomes FAILED here)
-- ARGV[5]  max attempts (0: no limit)
-- ARGV[6]  time to live of an IN_PROGRESS record, ms: two leases plus
--          idem.InProgressGrace (computed in Go)
--
-- Reply, one of:
--   {1, fence, attempts}                  Acquired (also when the same owner
--                                         repeats a call whose reply was lost)
--   {2, fence, attempts, previous owner}  TakenOver (the lease had expired)
--   {3, µs left on the lease, attempts}   InProgress
--   {4, state, attempts, result}          Replay; state is 'c' or 'f'
--   {5}                                   Mismatch
-- or an error for a record in an unknown format (nothing written).
local reply, err = acquire(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
if err then
  return redis.error_reply(err)
end
return reply
