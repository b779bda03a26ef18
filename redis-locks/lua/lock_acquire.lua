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
-- Its value is the token, followed, after a last release, by that
-- release's request id (see lock_release.lua). The clock's value is
-- written and the old one read in one SET ... GET; only when the clock has
-- not passed the last token (it went back, or two holds within one
-- microsecond) is the token raised past it in a second SET.
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
-- One call may take several locks, each as if alone (a caller that gathers
-- the acquisitions of many owners at once); Redis's clock is read once.
-- For the i-th lock (i = 1, 2, ...):
-- KEYS[2i-1]  the lock's key
-- KEYS[2i]    the lock's fencing-token key
-- ARGV[3i-2]  lease in milliseconds (> 0); every acquisition sets it, unless
--             more is left (a reentry never shortens the lock's lease)
-- ARGV[3i-1]  the owner
-- ARGV[3i]    the request id
-- and last, ARGV[#ARGV]: lifetime of the fencing-token keys in milliseconds.
--
-- Returns one answer per lock, in order:
--         {1, holds, token}  acquired; holds is this owner's hold count after
--                            it, token the holder's fencing token
--         {0, pttl, 0}       held by another owner; pttl is the lease left in
--                            ms (-1 only if someone removed the lease by hand)
local token_life = ARGV[#ARGV]
local now

-- Sets the lease of `key` to `lease` ms unless more is left: a hold taken
-- or given back with a shorter lease than one already running must not cut
-- the other holds short (the key would expire under them).
local function extend(key, lease)
    if redis.call('pttl', key) < tonumber(lease) then
        redis.call('pexpire', key, lease)
    end
end

-- The token in a fencing-token key's value ('token' or 'token request');
-- 0 for none.
local function token_in(value)
    return tonumber(string.match(value or '', '^%d+') or '0')
end

local function acquire(lock, fence, lease, owner, request)
    local record = 'req:' .. owner

    if redis.call('exists', lock) == 0 then
        if not now then
            local time = redis.call('time')
            now = tonumber(time[1]) * 1000000 + tonumber(time[2])
        end
        -- '%d' (a 64-bit integer in Redis's Lua): tostring() would write
        -- large numbers as 1.7e+15, and '%.0f' takes glibc's slower path
        -- for floating point. Strings, not numbers, go to redis.call: a
        -- number would be formatted again there.
        local token = now
        local text = string.format('%d', token)
        local last = token_in(redis.call('set', fence, text, 'PX', token_life, 'GET'))
        if last >= token then
            token = last + 1
            text = string.format('%d', token)
            redis.call('set', fence, text, 'PX', token_life)
        end
        redis.call('hset', lock, owner, '1', record, '1 ' .. text .. ' ' .. request)
        redis.call('pexpire', lock, lease)
        return {1, 1, token}
    end

    local found = redis.call('hmget', lock, owner, record)
    if not found[1] then
        return {0, redis.call('pttl', lock), 0}
    end
    local holds, token, id = string.match(found[2] or '', '^(%d+) (%d*) (.*)$')
    if id == request then
        return {1, tonumber(holds), tonumber(token)}
    end
    -- The holder's token: in its record since it took the lock, unless the
    -- fair lock's script (which writes no record) took it.
    if token == nil or token == '' then
        token = string.format('%d', token_in(redis.call('get', fence)))
    end
    holds = redis.call('hincrby', lock, owner, 1)
    redis.call('hset', lock, record, holds .. ' ' .. token .. ' ' .. request)
    extend(lock, lease)
    return {1, holds, tonumber(token)}
end

local answers = {}
for i = 1, #KEYS / 2 do
    answers[i] = acquire(KEYS[2 * i - 1], KEYS[2 * i],
        ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i])
end
return answers
