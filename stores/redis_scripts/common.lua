-- Shared by every script, which is sent with this text in front.

-- Lua numbers are doubles; '%d' keeps large integers out of exponent notation.
local function int(n)
  return string.format('%d', n)
end

-- The server's clock in ms, the only clock leases and timestamps are read from.
local function server_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
