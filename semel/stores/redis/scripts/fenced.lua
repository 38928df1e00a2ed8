-- Shared by the fenced writes (complete, fail, heartbeat, release), which are
-- sent with this text in front: only the holder of the current claim may
-- change a key.

-- Whether `fence` (the digits the client sent) is the current claim of a
-- record whose stored status and fence are `status` and `stored`. The stored
-- fence is the '%d' digits a script wrote, so comparing the texts compares
-- the numbers.
local function current(status, stored, fence)
  return status == 'in_progress' and stored == fence
end

-- Whether `fence` is the current claim of the in-progress record at `key`.
local function owns(key, fence)
  local status, stored = unpack(redis.call('HMGET', key, 'status', 'fence'))
  return current(status, stored, fence)
end
