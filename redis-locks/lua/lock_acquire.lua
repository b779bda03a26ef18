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
-- instead of a second hold. Successful acquisitions are remembered for a
-- while in the lock's request-log hash; failed ones change nothing anyway.
--
-- KEYS[1]  the lock's key
-- KEYS[2]  the lock's fencing-token key
-- KEYS[3]  the lock's request log (request id -> answer)
-- ARGV[1]  lease in milliseconds (> 0); every acquisition resets it
-- ARGV[2]  the owner
-- ARGV[3]  lifetime of the fencing-token key in milliseconds
-- ARGV[4]  the request id
-- ARGV[5]  how long the request log remembers, in milliseconds
--
-- Returns {1, holds, token}  acquired; holds is this owner's hold count after
--                            it, token the holder's fencing token
--         {0, pttl, 0}       held by another owner; pttl is the lease left in
--                            ms (-1 only if someone removed the lease by hand)
local replay = redis.call('hget', KEYS[3], ARGV[4])
if replay then
    local holds, token = string.match(replay, '^(%d+) (%d+)$')
    return {1, tonumber(holds), tonumber(token)}
end

local function remember(holds, token)
    redis.call('hset', KEYS[3], ARGV[4], holds .. ' ' .. string.format('%.0f', token))
    redis.call('pexpire', KEYS[3], ARGV[5])
end

local function new_token()
    local time = redis.call('time')
    local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
    local last = tonumber(redis.call('get', KEYS[2]) or '0')
    local token = math.max(last + 1, now)
    -- '%.0f': tostring() would write large numbers as 1.7e+15
    redis.call('set', KEYS[2], string.format('%.0f', token), 'PX', ARGV[3])
    return token
end

if redis.call('exists', KEYS[1]) == 0 then
    local token = new_token()
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    remember(1, token)
    return {1, 1, token}
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local holds = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    local token = tonumber(redis.call('get', KEYS[2]))
    if token == nil then
        token = new_token()
    end
    remember(holds, token)
    return {1, holds, token}
end
return {0, redis.call('pttl', KEYS[1]), 0}
