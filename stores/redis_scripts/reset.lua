-- Forget a key's outcome so it runs again, keeping its fence so fences stay
-- monotonic downstream: a released claim with no claims counted.
-- Sent after common.lua.
-- KEYS[1] the record's hash; ARGV[1] retention in ms.
-- Returns 1 when reset, 0 when the key is absent.
local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then
  return 0
end
local now = int(server_ms())
redis.call('HSET', key, 'status', 'in_progress', 'claims', '0', 'lease', now, 'updated', now)
redis.call('HDEL', key, 'result', 'error')
redis.call('PEXPIRE', key, ARGV[1])
return 1
