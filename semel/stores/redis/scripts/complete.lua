-- Fenced: only the holder of the current claim may complete a key.
-- Sent after common.lua and fenced.lua.
-- One key for complete(), many for complete_many(); each is fenced on its own.
-- KEYS the records' hashes; ARGV[1] retention in ms; ARGV[2i] the fence
-- and ARGV[2i + 1] the result as JSON for KEYS[i].
-- Returns one character per key, in order: '1' written, '0' fenced out,
-- 'R' refused: a value of another type than a hash holds the key, untouched.
-- Every key is read before any is written, so a refused key never leaves
-- the batch half written.
local now = int(server_ms())
local answers = {}
for i, key in ipairs(KEYS) do
  local fields = hmget_or_type(key, 'status', 'fence')
  if not fields then
    answers[i] = 'R'
  elseif current(fields[1], fields[2], ARGV[2 * i]) then
    answers[i] = '1'
  else
    answers[i] = '0'
  end
end
for i, key in ipairs(KEYS) do
  if answers[i] == '1' then
    redis.call('HSET', key, 'status', 'completed', 'result', ARGV[2 * i + 1], 'updated', now)
    redis.call('HDEL', key, 'lease', 'error')
    redis.call('PEXPIRE', key, ARGV[1])
  end
end
return table.concat(answers)
