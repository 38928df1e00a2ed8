-- Fenced: the holder extends its lease to server now + lock_ttl.
-- Sent after common.lua and fenced.lua.
-- KEYS[1] the record's hash; ARGV[1] fence, ARGV[2] lock_ttl in ms,
-- ARGV[3] TTL of a live record, max(retention, lock_ttl), in ms.
-- Returns 1 when extended, 0 when fenced out.
local key = KEYS[1]
if not owns(key, ARGV[1]) then
  return 0
end
local now = server_ms()
redis.call('HSET', key, 'lease', int(now + tonumber(ARGV[2])), 'updated', int(now))
redis.call('PEXPIRE', key, ARGV[3])
return 1
