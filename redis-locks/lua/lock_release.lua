-- Give back one hold of a reentrant lock; only its owner can.
--
-- The check of the owner and the delete are one atomic step: a GET followed
-- by a separate DEL could delete a lock that expired in between and was
-- taken by someone else. When the lock becomes free, waiters are told on
-- its channel so they try again at once instead of sleeping out the lease.
--
-- Idempotent per request id: a release resent after a timeout gets the
-- first answer again instead of giving back a second hold.
--
-- KEYS[1]  the lock's key
-- KEYS[2]  the lock's channel
-- KEYS[3]  the lock's request log (request id -> answer)
-- ARGV[1]  lease in milliseconds, renewed while holds remain
-- ARGV[2]  the owner
-- ARGV[3]  the request id
-- ARGV[4]  how long the request log remembers, in milliseconds
--
-- Returns -1  the owner does not hold the lock (never did, or its lease
--             ran out): nothing was changed
--          0  the last hold was released, the key deleted, waiters told
--         >0  holds still left to this owner; the lease was renewed
local replay = redis.call('hget', KEYS[3], ARGV[3])
if replay then
    return tonumber(replay)
end

local function answer(result)
    redis.call('hset', KEYS[3], ARGV[3], result)
    redis.call('pexpire', KEYS[3], ARGV[4])
    return result
end

if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return answer(-1)
end
local holds = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if holds > 0 then
    redis.call('pexpire', KEYS[1], ARGV[1])
    return answer(holds)
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], 'released')
return answer(0)
