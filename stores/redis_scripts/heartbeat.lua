-- Fenced: the holder extends its lease to server now + lock_ttl.
-- KEYS[1] the record's hash; ARGV[1] fence, ARGV[2] lock_ttl in ms,
-- ARGV[3] TTL of a live record, max(retention, lock_ttl), in ms.
-- Returns 1 when extended, 0 when fenced out.
local key = KEYS[1]
local status, fence = unpack(redis.call('HMGET', key, 'status', 'fence'))
if status ~= 'in_progress' or fence ~= ARGV[1] then
  return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', key, 'lease', string.format('%d', now + tonumber(ARGV[2])),
  'updated', string.format('%d', now))
redis.call('PEXPIRE', key, ARGV[3])
return 1
