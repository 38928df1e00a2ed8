-- Fenced: only the holder of the current claim may complete the key.
-- KEYS[1] the record's hash; ARGV[1] fence, ARGV[2] retention in ms,
-- ARGV[3] the result as JSON. Returns 1 when written, 0 when fenced out.
local key = KEYS[1]
local status, fence = unpack(redis.call('HMGET', key, 'status', 'fence'))
if status ~= 'in_progress' or fence ~= ARGV[1] then
  return 0
end
local time = redis.call('TIME')
local now = string.format('%d', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
redis.call('HSET', key, 'status', 'completed', 'result', ARGV[3], 'updated', now)
redis.call('HDEL', key, 'lease', 'error')
redis.call('PEXPIRE', key, ARGV[2])
return 1
