-- Decide a claim in one step: first claim, takeover, poison, or a refusal
-- that names the record it collided with. Times come from the server clock.
--
-- KEYS[1]  the record's hash
-- ARGV[1]  fingerprint          ARGV[2]  lock_ttl in ms
-- ARGV[3]  TTL of a terminal record (retention) in ms
-- ARGV[4]  TTL of a live record, max(retention, lock_ttl), in ms
-- ARGV[5]  max_claims           ARGV[6]  the poison error text
--
-- Returns {outcome, server_ms, pttl, fingerprint, status, fence, claims,
--          lease, result, error, first_seen, updated}; status and outcome
-- strings are the values of stores.base.Status and stores.base.Outcome.
local key = KEYS[1]
local fingerprint = ARGV[1]
local lock_ms = tonumber(ARGV[2])
local max_claims = tonumber(ARGV[5])

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- Lua numbers are doubles; '%d' keeps large integers out of exponent notation.
local function int(n)
  return string.format('%d', n)
end

local function reply(outcome)
  local record = redis.call('HMGET', key, 'fingerprint', 'status', 'fence', 'claims',
    'lease', 'result', 'error', 'first_seen', 'updated')
  return {outcome, now, redis.call('PTTL', key), unpack(record)}
end

local stored = redis.call('HMGET', key, 'fingerprint', 'status', 'fence', 'claims', 'lease')
local stored_fp, status, fence, claims, lease = stored[1], stored[2], stored[3], stored[4], stored[5]

if not stored_fp then
  -- Absent, or forgotten after retention: the fence restarts at 1. A stale
  -- owner could only collide with it after a whole retention period, far
  -- beyond any lease or handler timeout.
  redis.call('HSET', key, 'fingerprint', fingerprint, 'status', 'in_progress',
    'fence', '1', 'claims', '1', 'lease', int(now + lock_ms),
    'first_seen', int(now), 'updated', int(now))
  redis.call('PEXPIRE', key, ARGV[4])
  return reply('claimed')
end

if stored_fp ~= fingerprint then
  return reply('mismatch')
end
if status == 'completed' then
  return reply('duplicate')
end
if status == 'failed' then
  return reply('failed')
end
if tonumber(lease or 0) > now then
  return reply('in_progress')
end

if tonumber(claims) >= max_claims then
  redis.call('HSET', key, 'status', 'failed', 'error', ARGV[6], 'updated', int(now))
  redis.call('HDEL', key, 'lease')
  redis.call('PEXPIRE', key, ARGV[3])
  return reply('poison')
end

redis.call('HSET', key, 'fence', int(tonumber(fence) + 1), 'claims', int(tonumber(claims) + 1),
  'lease', int(now + lock_ms), 'updated', int(now))
redis.call('PEXPIRE', key, ARGV[4])
return reply('claimed')
