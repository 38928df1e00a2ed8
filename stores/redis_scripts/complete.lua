-- Fenced: only the holder of the current claim may complete a key.
-- One key for complete(), many for complete_many(); each is fenced on its own.
-- KEYS the records' hashes; ARGV[1] retention in ms; ARGV[2i] the fence
-- and ARGV[2i + 1] the result as JSON for KEYS[i].
-- Returns one character per key, in order: '1' written, '0' fenced out.
local time = redis.call('TIME')
local now = string.format('%d', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
local written = {}
for i, key in ipairs(KEYS) do
  local status, fence = unpack(redis.call('HMGET', key, 'status', 'fence'))
  if status == 'in_progress' and fence == ARGV[2 * i] then
    redis.call('HSET', key, 'status', 'completed', 'result', ARGV[2 * i + 1], 'updated', now)
    redis.call('HDEL', key, 'lease', 'error')
    redis.call('PEXPIRE', key, ARGV[1])
    written[i] = '1'
  else
    written[i] = '0'
  end
end
return table.concat(written)
