-- Read a record in claim.lua's reply shape, [server_ms, record_json] with
-- the outcome left empty, so one decoder serves both.
-- Sent after common.lua and record.lua.
-- KEYS[1] the record's hash. Returns nil when the key is absent.
local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then
  return nil
end
return '[' .. int(server_ms()) .. ',' .. record_json(key, '') .. ']'
