-- Fenced: the holder extends its lease to server now + lock_ttl, while that
-- lease still runs. A release ends the lease at its own instant, so a
-- heartbeat that lands after it (a renewal the release did not wait for)
-- finds it over and cannot hold the key for nobody.
-- Sent after common.lua and fenced.lua.
-- KEYS[1] the record's hash; ARGV[1] fence, ARGV[2] lock_ttl in ms,
-- ARGV[3] TTL of a live record, max(retention, lock_ttl), in ms.
-- Returns 1 when extended, 0 when fenced out or the lease is over.
local key = KEYS[1]
local status, stored, lease = unpack(redis.call('HMGET', key, 'status', 'fence', 'lease'))
local now = server_ms()
if not current(status, stored, ARGV[1]) or not (tonumber(lease or 0) > now) then
  return 0
end
redis.call('HSET', key, 'lease', int(now + tonumber(ARGV[2])), 'updated', int(now))
redis.call('PEXPIRE', key, ARGV[3])
return 1
