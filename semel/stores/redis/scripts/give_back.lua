-- Fenced: hand back a claim that never reached its handler, because the
-- batch that granted it failed on another server or was not replicated. As
-- release.lua, the lease ends now so the next claim gets in at once; and the
-- claim is not counted, so an outage that fails batch after batch never
-- makes a key look like it crashes its workers (max_claims, poison). The
-- fence stays: fences only grow. Sent after common.lua and fenced.lua.
-- KEYS[1] the record's hash; ARGV[1] fence, ARGV[2] retention in ms.
-- Returns 1 when written, 0 when fenced out.
local key = KEYS[1]
if not owns(key, ARGV[1]) then
  return 0
end
local now = int(server_ms())
local claims = tonumber(redis.call('HGET', key, 'claims'))
redis.call('HSET', key, 'lease', now, 'updated', now, 'claims', int(math.max(claims - 1, 0)))
redis.call('PEXPIRE', key, ARGV[2])
return 1
