-- newkey.lua: a wrk script that POSTs /payments with a new Idempotency-Key
-- on every request; each wrk thread numbers its own keys, and a run
-- prefixes them with its start time.
local counter = 1
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end
function init(args)
  n = 0
  run = tostring(os.time())
end
request = function()
  n = n + 1
  return wrk.format("POST", "/payments", {["Idempotency-Key"] = run .. "-" .. id .. "-" .. n, ["Content-Type"] = "application/json"}, '{"amount":100}')
end
