-- Acknowledges a consumer's written entries and removes them from the
-- stream, in one step: afterwards the stream holds exactly the entries
-- no group has had acknowledged (undelivered, or pending with a consumer),
-- as with XACK and XDEL, at a fraction of XDEL's cost in the usual case.
--
-- Every entry older than a bound is gone in one XTRIM MINID: the bound is,
-- over the stream's groups, the oldest entry still pending, or the one
-- after the last delivered when none is. Below it every entry was
-- delivered (a group delivers in order) and is pending no more, so it was
-- acknowledged. Only the entries acknowledged here that are not below it
-- (an older entry is still pending: another consumer's batch under way,
-- or a dead consumer's left for a claim) are deleted one by one.
--
-- KEYS[1]    the stream
-- ARGV[1]    the group
-- ARGV[2..]  the ids of the entries to acknowledge
--
-- Returns the number of entries acknowledged
local acked = redis.call('xack', KEYS[1], ARGV[1], unpack(ARGV, 2))
if redis.call('exists', KEYS[1]) == 0 then
    return acked
end

-- A stream id "ms-seq" as two numbers (milliseconds fit a double exactly;
-- sequences stay far below 2^53).
local function parse(id)
    local ms, seq = string.match(id, '^(%d+)-(%d+)$')
    return tonumber(ms), tonumber(seq)
end
local function older(a_ms, a_seq, b_ms, b_seq)
    return a_ms < b_ms or (a_ms == b_ms and a_seq < b_seq)
end

local bound_ms, bound_seq
for _, group in ipairs(redis.call('xinfo', 'groups', KEYS[1])) do
    local name, delivered
    for i = 1, #group, 2 do
        if group[i] == 'name' then
            name = group[i + 1]
        elseif group[i] == 'last-delivered-id' then
            delivered = group[i + 1]
        end
    end
    local ms, seq
    local pending = redis.call('xpending', KEYS[1], name)
    if pending[1] > 0 then
        ms, seq = parse(pending[2])
    else
        ms, seq = parse(delivered)
        seq = seq + 1
    end
    if not bound_ms or older(ms, seq, bound_ms, bound_seq) then
        bound_ms, bound_seq = ms, seq
    end
end
if not bound_ms then
    return acked
end
redis.call('xtrim', KEYS[1], 'MINID', string.format('%d-%d', bound_ms, bound_seq))

local left = {}
for i = 2, #ARGV do
    local ms, seq = parse(ARGV[i])
    if ms and not older(ms, seq, bound_ms, bound_seq) then
        left[#left + 1] = ARGV[i]
    end
end
if #left > 0 then
    redis.call('xdel', KEYS[1], unpack(left))
end
return acked
