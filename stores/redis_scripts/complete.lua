-- Fenced: only the holder of the current claim may complete a key.
-- Sent after common.lua and fenced.lua.
-- One key for complete(), many for complete_many(); each is fenced on its own.
-- KEYS the records' hashes; ARGV[1] retention in ms; ARGV[2i] the fence
-- and ARGV[2i + 1] the result as JSON for KEYS[i].
-- Returns one character per key, in order: '1' written, '0' fenced out.
local now = int(server_ms())
local written = {}
for i, key in ipairs(KEYS) do
  if owns(key, ARGV[2 * i]) then
    redis.call('HSET', key, 'status', 'completed', 'result', ARGV[2 * i + 1], 'updated', now)
    redis.call('HDEL', key, 'lease', 'error')
    redis.call('PEXPIRE', key, ARGV[1])
    written[i] = '1'
  else
    written[i] = '0'
  end
end
return table.concat(written)
