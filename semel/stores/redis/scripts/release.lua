-- Fenced: the holder gives its claim up. The lease ends now rather than
-- being deleted, so the next claim takes over with fence + 1 and counts
-- towards max_claims. Sent after common.lua and fenced.lua.
-- KEYS[1] the record's hash; ARGV[1] fence, ARGV[2] retention in ms.
-- Returns 1 when written, 0 when fenced out.
local key = KEYS[1]
if not owns(key, ARGV[1]) then
  return 0
end
local now = int(server_ms())
redis.call('HSET', key, 'lease', now, 'updated', now)
redis.call('PEXPIRE', key, ARGV[2])
return 1
