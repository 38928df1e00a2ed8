-- Read a record with the server time and its TTL, in claim.lua's reply
-- shape (outcome left empty), so one decoder serves both.
-- KEYS[1] the record's hash. Returns nil when the key is absent.
local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then
  return nil
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local record = redis.call('HMGET', key, 'fingerprint', 'status', 'fence', 'claims',
  'lease', 'result', 'error', 'first_seen', 'updated')
return {'', now, redis.call('PTTL', key), unpack(record)}
