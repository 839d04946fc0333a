-- effect.lib.lua: what a registered effect's body runs with. scripts.go
-- makes each effect's script from complete.lib.lua, this file, the body as
-- the Lua function effect(KEYS, ARGV, FENCE), whose first line is
-- "local redis = tracked", and complete_effect.lua.
--
-- tracked is redis for the body, except that redis.call and redis.pcall
-- note the commands that succeeded, so that wrote() can tell, when the body
-- failed, whether it may have written anything. Redis does not undo what a
-- script wrote before it failed: a body that failed before its first write
-- left the data as it was (its key may be released and run again), one
-- that failed after it may have partly applied (its key must not run again).
-- A command that failed (WRONGTYPE, OOM, an ACL refusal) wrote nothing.
local called = {}
local server = redis
local tracked = setmetatable({
  call = function(cmd, ...)
    local r = server.call(cmd, ...)
    called[#called + 1] = cmd
    return r
  end,
  pcall = function(cmd, ...)
    local r = server.pcall(cmd, ...)
    if type(r) ~= 'table' or not r.err then
      called[#called + 1] = cmd
    end
    return r
  end,
}, { __index = server })

-- wrote reports whether a command that succeeded may have written: any
-- command but these reads counts as a write.
local function wrote()
  local reads = {}
  for _, c in ipairs({
    'get', 'mget', 'strlen', 'getrange', 'substr', 'lcs', 'exists', 'type', 'ttl', 'pttl',
    'expiretime', 'pexpiretime', 'time', 'getbit', 'bitcount', 'bitpos', 'bitfield_ro',
    'hget', 'hmget', 'hgetall', 'hexists', 'hlen', 'hkeys', 'hvals', 'hstrlen', 'hrandfield', 'hscan',
    'llen', 'lindex', 'lrange', 'lpos',
    'scard', 'sismember', 'smismember', 'smembers', 'srandmember', 'sinter', 'sintercard', 'sunion',
    'sdiff', 'sscan',
    'zcard', 'zscore', 'zmscore', 'zrank', 'zrevrank', 'zcount', 'zlexcount', 'zrange',
    'zrangebyscore', 'zrevrange', 'zrevrangebyscore', 'zrangebylex', 'zrevrangebylex',
    'zrandmember', 'zinter', 'zintercard', 'zunion', 'zdiff', 'zscan',
    'xlen', 'xrange', 'xrevrange', 'xpending', 'xinfo',
    'geopos', 'geodist', 'geohash', 'geosearch', 'georadius_ro', 'georadiusbymember_ro', 'sort_ro',
  }) do
    reads[c] = true
  end
  for _, c in ipairs(called) do
    if not reads[string.lower(tostring(c))] then
      return true
    end
  end
  return false
end
