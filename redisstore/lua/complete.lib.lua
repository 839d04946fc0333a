-- complete.lib.lua: the complete transition as a function, for
-- complete_many.lua, complete_ack.lua and complete_ack_many.lua, to which
-- scripts.go prepends it. complete.lua, the hot path, carries the same
-- transition inline (see scripts.go): change both. Record format: see
-- acquire.lib.lua.

-- complete stores result in the record at key and moves it to COMPLETED if
-- owner and fence (a string) still hold it. The owner and the lease end are
-- dropped: a completed record needs neither, and memory per record counts;
-- the creation time stays (idem get and ls show a record's age), as its
-- offset from the fence, which completion keeps. It
-- returns 1 if it wrote the record, 2 if the record was already completed
-- by this fence with this result (a repeated call after a lost reply), 0 if
-- the lease is lost (nothing written), or nil
-- and an error message. before, if not nil, is called with the fence after
-- the checks and right before the write (complete_effect.lua applies the
-- effect there); when it returns an error message, complete does not
-- complete the record and returns nil and that message: it writes nothing,
-- or, when before also returns a result, ends the record FAILED with that
-- result, as fail.lua does (an effect that failed after it wrote).
local function complete(key, owner, fence_arg, result, retention_ms, before)
  local v = redis.call('GET', key)
  if not v then
    return 0
  end
  local ver, s, f, o, n, l, a, c, r = cmsgpack.unpack(v)
  if ver ~= 1 then
    return nil, 'idem: unknown record format'
  end
  local fence = tonumber(fence_arg)
  if s == 'c' and n == fence and r == result then
    return 2
  end
  if s ~= 'p' or o ~= owner or n ~= fence then
    return 0
  end
  if before then
    local err, failed = before(n)
    if err then
      if failed then
        redis.call('SET', key, cmsgpack.pack(1, 'f', f, '', n, 0, a, c, failed), 'PX', retention_ms)
      end
      return nil, err
    end
  end
  redis.call('SET', key, cmsgpack.pack(1, 'c', f, '', n, 0, a, c, result), 'PX', retention_ms)
  return 1
end
