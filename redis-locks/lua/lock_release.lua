-- Give back one hold of each of one or more reentrant locks; only its
-- owner can. One lock is the common case; a caller that holds many at
-- once (a batch of purchases that just committed) gives them all back in
-- one call.
--
-- The check of the owner and the delete are one atomic step: a GET followed
-- by a separate DEL could delete a lock that expired in between and was
-- taken by someone else. When a lock becomes free, waiters are told on
-- its channel so they try again at once instead of sleeping out the lease.
--
-- Idempotent per request id: a release resent after a timeout gets the
-- first answer again instead of giving back a second hold. While holds
-- remain, the answer is the owner's record in the lock's hash (see
-- lock_acquire.lua); the last release deletes the hash, so its answer is
-- kept after the token in the lock's fencing-token key, which outlives the
-- lock ('token request'): no key of its own per release. It is kept until
-- the lock is next taken; a resend that arrives after that is told the
-- owner no longer holds the lock, which is true.
--
-- A guard gives back only a hold of its own tenure: it sends its fencing
-- token, and a hold of the same owner under another token (its lease ran
-- out, and the owner took the lock again: a retry of the same job) is not
-- its to give back.
--
-- For the i-th lock (i = 1, 2, ...):
-- KEYS[3i-2]  the lock's key
-- KEYS[3i-1]  the lock's channel
-- KEYS[3i]    the lock's fencing-token key
-- ARGV[4i-3]  the lease in milliseconds, renewed while holds remain (never
--             shortened)
-- ARGV[4i-2]  the owner
-- ARGV[4i-1]  the request id
-- ARGV[4i]    the holder's fencing token, or '' (any hold of the owner)
-- and last, ARGV[#ARGV]: lifetime of the fencing-token keys in milliseconds.
--
-- Returns one answer per lock, in order:
--         -1  the owner does not hold the lock (never did, or its lease
--             ran out), or holds it under another token: nothing was
--             changed
--          0  the last hold was released, the key deleted, waiters told
--         >0  holds still left to this owner; the lease was renewed
local token_life = ARGV[#ARGV]

-- Sets the lease of `key` to `lease` ms unless more is left: a hold taken
-- or given back with a shorter lease than one already running must not cut
-- the other holds short (the key would expire under them).
local function extend(key, lease)
    if redis.call('pttl', key) < tonumber(lease) then
        redis.call('pexpire', key, lease)
    end
end

local function release(lock, channel, fence, lease, owner, request, tenure)
    local record = 'req:' .. owner
    local found = redis.call('hmget', lock, owner, record)
    local holds, token, id = string.match(found[2] or '', '^(%d+) (%d*) (.*)$')
    if id == request then
        return tonumber(holds)
    end
    if not found[1] then
        -- Not held: unless this very request released the last hold.
        local last = redis.call('get', fence)
        if last and string.match(last, '^%d+ (.*)$') == request then
            return 0
        end
        return -1
    end
    -- A hold the fair lock's script took has no token in a record: the
    -- fencing-token key has it.
    if token == nil or token == '' then
        token = string.match(redis.call('get', fence) or '', '^%d+') or '0'
    end
    if tenure ~= '' and tenure ~= token then
        return -1
    end

    if tonumber(found[1]) > 1 then
        holds = redis.call('hincrby', lock, owner, -1)
        -- The holder's token stays in its record (for a hold the fair
        -- lock's script took, the one its fencing-token key holds).
        redis.call('hset', lock, record, holds .. ' ' .. token .. ' ' .. request)
        extend(lock, lease)
        return holds
    end
    redis.call('del', lock)
    redis.call('publish', channel, 'released')
    redis.call('set', fence, token .. ' ' .. request, 'PX', token_life)
    return 0
end

local answers = {}
for i = 1, #KEYS / 3 do
    answers[i] = release(KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i],
        ARGV[4 * i - 3], ARGV[4 * i - 2], ARGV[4 * i - 1], ARGV[4 * i])
end
return answers
