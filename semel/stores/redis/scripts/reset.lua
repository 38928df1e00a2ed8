-- Forget a failed key's outcome so it runs again, keeping its fence so fences
-- stay monotonic downstream: a released claim with no claims counted. Only a
-- failed key is reset, poison included: marked failed, or in progress with
-- its claims used up and no lease (the next claim would mark it). A completed
-- key stays completed, so a replayed copy of it is a duplicate, and a claim
-- in hand keeps its lease. A fingerprint given replaces the record's: the
-- key runs again with an edited body, and the old body is then the mismatch.
-- Sent after common.lua.
-- KEYS[1] the record's hash; ARGV[1] retention in ms, ARGV[2] max_claims,
-- ARGV[3] (optional) the fingerprint the next claim must bring.
-- Returns 1 when reset, 0 when the key is absent or not failed.
local key = KEYS[1]
local status, claims, lease = unpack(redis.call('HMGET', key, 'status', 'claims', 'lease'))
local now = server_ms()
local exhausted = status == 'in_progress' and tonumber(claims or 0) >= tonumber(ARGV[2])
  and not (tonumber(lease or 0) > now)
if status ~= 'failed' and not exhausted then
  return 0
end
redis.call('HSET', key, 'status', 'in_progress', 'claims', '0', 'lease', int(now), 'updated', int(now))
if ARGV[3] then
  redis.call('HSET', key, 'fingerprint', ARGV[3])
end
redis.call('HDEL', key, 'result', 'error')
redis.call('PEXPIRE', key, ARGV[1])
return 1
