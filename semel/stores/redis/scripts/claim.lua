-- Decide claims, each key in one step: first claim, takeover, poison, or a
-- refusal that names the record it collided with. Times come from the
-- server clock, read once: the whole script is one atomic step.
-- Sent after common.lua and record.lua.
-- One key for claim(), many for claim_many().
--
-- KEYS     the records' hashes, one per key claimed
-- ARGV[1]  lock_ttl in ms
-- ARGV[2]  TTL of a terminal record (retention) in ms
-- ARGV[3]  TTL of a live record, max(retention, lock_ttl), in ms
-- ARGV[4]  max_claims           ARGV[5]  the poison error text
-- ARGV[5 + i]  the fingerprint claimed for KEYS[i]
--
-- Returns JSON text [server_ms, server_us, answer for KEYS[1], ...]: 0 for a
-- key that was absent and is now claimed (fence server_us, claims 1, lease and
-- first_seen from server_ms, TTL of a live record); a JSON string, the name of its
-- type, for a key a foreign value holds (refused and left untouched); else
-- the record_json of the key.
local lock_ms = tonumber(ARGV[1])
local max_claims = tonumber(ARGV[4])
local now, now_us = server_clock()

-- `stored`: the key's fields fingerprint, status, fence, claims and lease.
local function claim(key, fingerprint, stored)
  local stored_fp, status, fence, claims, lease = stored[1], stored[2], stored[3], stored[4], stored[5]

  if not stored_fp then
    -- Absent: never seen, or forgotten (retention, eviction, a failover that
    -- lost a write). The fence starts at the server clock in µs, above every
    -- fence the key had: those started from an earlier reading and grew by one
    -- per takeover, each a lapsed lease or a release, never a million a second.
    redis.call('HSET', key, 'fingerprint', fingerprint, 'status', 'in_progress',
      'fence', int(now_us), 'claims', '1', 'lease', int(now + lock_ms),
      'first_seen', int(now), 'updated', int(now))
    redis.call('PEXPIRE', key, ARGV[3])
    return '0'
  end

  if stored_fp ~= fingerprint then
    return record_json(key, 'mismatch')
  end
  if status == 'completed' then
    return record_json(key, 'duplicate')
  end
  if status == 'failed' then
    return record_json(key, 'failed')
  end
  if tonumber(lease or 0) > now then
    return record_json(key, 'in_progress')
  end

  if tonumber(claims) >= max_claims then
    redis.call('HSET', key, 'status', 'failed', 'error', ARGV[5], 'updated', int(now))
    redis.call('HDEL', key, 'lease')
    redis.call('PEXPIRE', key, ARGV[2])
    return record_json(key, 'poison')
  end

  redis.call('HSET', key, 'fence', int(tonumber(fence) + 1), 'claims', int(tonumber(claims) + 1),
    'lease', int(now + lock_ms), 'updated', int(now))
  redis.call('PEXPIRE', key, ARGV[3])
  return record_json(key, 'claimed')
end

-- Every key is read before any is written: a foreign key is answered alone
-- and never stops the batch half written.
local answers = {int(now), int(now_us)}
local stored = {}
for i, key in ipairs(KEYS) do
  local fields, foreign = hmget_or_type(key, 'fingerprint', 'status', 'fence', 'claims', 'lease')
  stored[i] = fields
  if foreign then
    answers[i + 2] = cjson.encode(foreign)
  end
end
for i, key in ipairs(KEYS) do
  if stored[i] then
    answers[i + 2] = claim(key, ARGV[5 + i], stored[i])
  end
end
return '[' .. table.concat(answers, ',') .. ']'
