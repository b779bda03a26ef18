-- Take a reentrant lock, or take it once more if the caller already holds it.
--
-- The lock is a hash of owner -> hold count, with a lease (PEXPIRE) on the
-- whole key: Redisson's RLock layout. An owner is a process UUID plus an
-- explicit per-owner id chosen by the caller, never an OS thread id.
--
-- Every new holder gets a fencing token larger than any earlier holder's
-- of this lock: max(last token + 1, Redis's clock in microseconds). The
-- last token lives in its own key (same hash slot), which outlives the
-- lock; should it ever expire, the clock alone still moves the tokens on.
-- A reentrant acquisition keeps the holder's token.
--
-- Idempotent per request id: a request resent after a timeout (its first
-- send may have been applied, the answer lost) gets the first answer again
-- instead of a second hold. The answer is remembered in the lock's own
-- hash, in the owner's record field ('req:' .. owner: an owner starts with
-- its process UUID, so no owner has that name), as 'holds token request-id'
-- (acquire and release alike): it lives as long as the hold it describes,
-- and costs no key and no expiry of its own. A first send whose hold has
-- since ended (released or run out) left nothing to replay, and nothing to
-- take twice: the resend is a new attempt.
--
-- KEYS[1]  the lock's key
-- KEYS[2]  the lock's fencing-token key
-- ARGV[1]  lease in milliseconds (> 0); every acquisition resets it
-- ARGV[2]  the owner
-- ARGV[3]  the request id
-- ARGV[4]  lifetime of the fencing-token key in milliseconds
--
-- Returns {1, holds, token}  acquired; holds is this owner's hold count after
--                            it, token the holder's fencing token
--         {0, pttl, 0}       held by another owner; pttl is the lease left in
--                            ms (-1 only if someone removed the lease by hand)
local record = 'req:' .. ARGV[2]

if redis.call('exists', KEYS[1]) == 0 then
    local time = redis.call('time')
    local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
    local last = tonumber(redis.call('get', KEYS[2]) or '0')
    local token = math.max(last + 1, now)
    -- '%.0f': tostring() would write large numbers as 1.7e+15
    token = string.format('%.0f', token)
    redis.call('set', KEYS[2], token, 'PX', ARGV[4])
    redis.call('hset', KEYS[1], ARGV[2], 1, record, '1 ' .. token .. ' ' .. ARGV[3])
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, 1, tonumber(token)}
end

local found = redis.call('hmget', KEYS[1], ARGV[2], record)
if not found[1] then
    return {0, redis.call('pttl', KEYS[1]), 0}
end
local holds, token, id = string.match(found[2] or '', '^(%d+) (%d*) (.*)$')
if id == ARGV[3] then
    return {1, tonumber(holds), tonumber(token)}
end
-- The holder's token: in its record since it took the lock, unless the
-- fair lock's script (which writes no record) took it.
if token == nil or token == '' then
    token = string.format('%.0f', tonumber(redis.call('get', KEYS[2]) or '0'))
end
holds = redis.call('hincrby', KEYS[1], ARGV[2], 1)
redis.call('hset', KEYS[1], record, holds .. ' ' .. token .. ' ' .. ARGV[3])
redis.call('pexpire', KEYS[1], ARGV[1])
return {1, holds, tonumber(token)}
