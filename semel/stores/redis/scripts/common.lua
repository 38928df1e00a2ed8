-- Shared by every script, which is sent with this text in front.

-- Lua numbers are doubles; '%d' keeps large integers out of exponent notation.
local function int(n)
  return string.format('%d', n)
end

-- The server's clock, the only clock leases, timestamps and fences are read
-- from: one reading in ms and in µs since the Unix epoch. Both are integers
-- well below 2^53, which a double holds exactly.
local function server_clock()
  local time = redis.call('TIME')
  local seconds, micros = tonumber(time[1]), tonumber(time[2])
  return seconds * 1000 + math.floor(micros / 1000), seconds * 1000000 + micros
end

local function server_ms()
  return (server_clock())
end

-- HMGET of `key`, or nil and the key's type when a value of another type
-- than a hash holds the key (WRONGTYPE): a foreign value, which semel leaves
-- alone. Any other error is raised as redis.call raises it. Batches read
-- every key through this before writing any, so a foreign key is answered on
-- its own and never stops a batch half written.
local function hmget_or_type(key, ...)
  local fields = redis.pcall('HMGET', key, ...)
  if fields.err == nil then
    return fields
  end
  if string.sub(fields.err, 1, 10) ~= 'WRONGTYPE ' then
    error(fields)
  end
  return nil, redis.call('TYPE', key).ok
end
