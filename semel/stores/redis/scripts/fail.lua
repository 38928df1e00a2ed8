-- Fenced: only the holder of the current claim may fail the key terminally.
-- Sent after common.lua and fenced.lua.
-- KEYS[1] the record's hash; ARGV[1] fence, ARGV[2] retention in ms,
-- ARGV[3] the error text. Returns 1 when written, 0 when fenced out.
local key = KEYS[1]
if not owns(key, ARGV[1]) then
  return 0
end
local now = int(server_ms())
redis.call('HSET', key, 'status', 'failed', 'error', ARGV[3], 'updated', now)
redis.call('HDEL', key, 'lease', 'result')
redis.call('PEXPIRE', key, ARGV[2])
return 1
