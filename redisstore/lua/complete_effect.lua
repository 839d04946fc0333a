-- complete_effect.lua: complete.lua (or complete_ack.lua) with a registered
-- effect applied in the same call, after the owner and fence check and
-- before the COMPLETED write
-- (docs/design.md#redis-scripts-functions-and-effects). scripts.go makes one
-- script per registered effect: complete.lib.lua, effect.lib.lua, then the
-- effect's body as the Lua function effect(KEYS, ARGV, FENCE), then this
-- file.
--
-- KEYS[1]       the record (format: see acquire.lua)
-- KEYS[2]       the stream, when ARGV[7] is not ''; it shares the record's
--               hash tag
-- KEYS[2 or 3…] the effect's keys, passed to it as its KEYS
-- ARGV[1]       owner token
-- ARGV[2]       fence
-- ARGV[3]       result blob
-- ARGV[4]       retention, ms
-- ARGV[5]       notification command: PUBLISH, SPUBLISH, or '' for none
-- ARGV[6]       notification channel
-- ARGV[7]       consumer group whose entry to acknowledge (XACK), or ''
-- ARGV[8]       stream entry ID (ignored when ARGV[7] is '')
-- ARGV[9]       the result stored with FAILED when the effect fails after
--               it may have written
-- ARGV[10…]     the effect's arguments, passed to it as its ARGV
--
-- The effect runs only when the record is IN_PROGRESS with this owner and
-- fence, so a stale owner's effect never runs, and a call repeated after a
-- lost reply finds the record COMPLETED by this fence with this result and
-- returns 1 without running it again. When the effect raises an error (or
-- returns redis.error_reply), there is no COMPLETED record and no XACK.
-- Redis does not undo what the effect wrote before it failed, so: when it
-- failed before its first write (effect.lib.lua's wrote()), nothing more is
-- written and the record stays IN_PROGRESS (the caller releases or fails
-- it); when it may have written, this call ends the record FAILED with
-- ARGV[9] and notifies as fail.lua does, so that no retry runs the effect
-- again, and a call repeated after that reply was lost answers the same.
--
-- Reply: 1 done (also for a repeated call), 0 lease lost (nothing applied,
-- written or acknowledged), an error reply starting with IDEMEFFECT for an
-- effect that failed before its first write, one starting with
-- IDEMPARTIAL for an effect that failed after it may have written (the
-- record is FAILED), or an error for a record in an unknown format.
local first, ack = 2, ARGV[7] ~= ''
if ack then
  first = 3
end
local ekeys, eargs = {}, {}
for i = first, #KEYS do
  ekeys[#ekeys + 1] = KEYS[i]
end
for i = 10, #ARGV do
  eargs[#eargs + 1] = ARGV[i]
end
local failed, partial
local done, err = complete(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], function(fence)
  local ok, r = pcall(effect, ekeys, eargs, fence)
  if not ok then
    if type(r) == 'table' then
      r = r.err
    end
    failed = tostring(r)
  elseif type(r) == 'table' and r.err then
    failed = tostring(r.err)
  end
  if failed and wrote() then
    partial = true
    return failed, ARGV[9]
  end
  return failed
end)
if partial then
  if ARGV[5] ~= '' then
    redis.call(ARGV[5], ARGV[6], 'f')
  end
  return redis.error_reply('IDEMPARTIAL ' .. failed)
end
if failed then
  return redis.error_reply('IDEMEFFECT ' .. failed)
end
if err then
  return redis.error_reply(err)
end
if done == 0 then
  -- The record this call ended FAILED, when a repeated call finds it.
  local v = redis.call('GET', KEYS[1])
  if v then
    local ver, s, f, o, n, l, a, c, r = cmsgpack.unpack(v)
    if ver == 1 and s == 'f' and n == tonumber(ARGV[2]) and r == ARGV[9] then
      return redis.error_reply('IDEMPARTIAL (a repeated call; the first one ended the key FAILED)')
    end
  end
  return 0
end
if ack then
  redis.call('XACK', KEYS[2], ARGV[7], ARGV[8])
end
if done == 1 and ARGV[5] ~= '' then
  redis.call(ARGV[5], ARGV[6], 'c')
end
return 1
