-- Shared by claim.lua and get.lua, which are sent with this text in front
-- (after common.lua).
--
-- A reply is JSON text the client decodes in one call, not a RESP array it
-- would parse element by element. Stored numbers are the '%d' digits the
-- scripts wrote and the result is JSON already, so both go in verbatim;
-- only free text (fingerprint, error) needs cjson's quoting.

-- {outcome, pttl, fingerprint, status, fence, claims, lease, result, error,
--  first_seen, updated}; outcome and status are the values of
-- semel.stores.base.Outcome and semel.stores.base.Status.
local function record_json(key, outcome)
  local r = redis.call('HMGET', key, 'fingerprint', 'status', 'fence', 'claims',
    'lease', 'result', 'error', 'first_seen', 'updated')
  return table.concat({
    '["', outcome, '",', int(redis.call('PTTL', key)), ',', cjson.encode(r[1]),
    ',"', r[2], '",', r[3], ',', r[4], ',', r[5] or 'null', ',', r[6] or 'null',
    ',', r[7] and cjson.encode(r[7]) or 'null', ',', r[8] or 'null', ',', r[9] or 'null', ']'})
end
