-- Give back one hold of a reentrant lock; only its owner can.
--
-- The check of the owner and the delete are one atomic step: a GET followed
-- by a separate DEL could delete a lock that expired in between and was
-- taken by someone else. When the lock becomes free, waiters are told on
-- its channel so they try again at once instead of sleeping out the lease.
--
-- KEYS[1]  the lock's key
-- KEYS[2]  the lock's channel
-- ARGV[1]  lease in milliseconds, renewed while holds remain
-- ARGV[2]  the owner
--
-- Returns -1  the owner does not hold the lock (never did, or its lease
--             ran out): nothing was changed
--          0  the last hold was released, the key deleted, waiters told
--         >0  holds still left to this owner; the lease was renewed
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return -1
end
local holds = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if holds > 0 then
    redis.call('pexpire', KEYS[1], ARGV[1])
    return holds
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[2], 'released')
return 0
