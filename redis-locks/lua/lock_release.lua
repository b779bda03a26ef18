-- Give back one hold of a reentrant lock; only its owner can.
--
-- The check of the owner and the delete are one atomic step: a GET followed
-- by a separate DEL could delete a lock that expired in between and was
-- taken by someone else. When the lock becomes free, waiters are told on
-- its channel so they try again at once instead of sleeping out the lease.
--
-- Idempotent per request id: a release resent after a timeout gets the
-- first answer again instead of giving back a second hold. While holds
-- remain, the answer is the owner's record in the lock's hash (see
-- lock_acquire.lua); the last release deletes the hash, so its answer is
-- kept in a key of its own, named after the request, which expires.
--
-- KEYS[1]  the lock's key
-- KEYS[2]  the lock's channel
-- KEYS[3]  where the answer of a last release is kept (one key per request)
-- ARGV[1]  lease in milliseconds, renewed while holds remain
-- ARGV[2]  the owner
-- ARGV[3]  the request id
-- ARGV[4]  how long the answer of a last release is kept, in milliseconds
--
-- Returns -1  the owner does not hold the lock (never did, or its lease
--             ran out): nothing was changed
--          0  the last hold was released, the key deleted, waiters told
--         >0  holds still left to this owner; the lease was renewed
local record = 'req:' .. ARGV[2]
local found = redis.call('hmget', KEYS[1], ARGV[2], record)
local holds, token, id = string.match(found[2] or '', '^(%d+) (%d*) (.*)$')
if id == ARGV[3] then
    return tonumber(holds)
end
if not found[1] then
    -- Not held: unless this very request released the last hold.
    if redis.call('exists', KEYS[3]) == 1 then
        return 0
    end
    return -1
end

if tonumber(found[1]) > 1 then
    holds = redis.call('hincrby', KEYS[1], ARGV[2], -1)
    -- The holder's token stays in its record ('' for a hold the fair
    -- lock's script took, which writes no record).
    redis.call('hset', KEYS[1], record, holds .. ' ' .. (token or '') .. ' ' .. ARGV[3])
    redis.call('pexpire', KEYS[1], ARGV[1])
    return holds
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], 'released')
redis.call('set', KEYS[3], 0, 'PX', ARGV[4])
return 0
