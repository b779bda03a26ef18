-- Take a reentrant lock, or take it once more if the caller already holds it.
--
-- The lock is a hash of owner -> hold count, with a lease (PEXPIRE) on the
-- whole key: Redisson's RLock layout. An owner is a process UUID plus an
-- explicit per-owner id chosen by the caller, never an OS thread id.
--
-- KEYS[1]  the lock's key
-- ARGV[1]  lease in milliseconds (> 0); every acquisition resets it
-- ARGV[2]  the owner
--
-- Returns {1, holds}  acquired; holds is this owner's hold count after it
--         {0, pttl}   held by another owner; pttl is the lease left in ms
--                     (-1 only if someone removed the lease by hand)
if redis.call('exists', KEYS[1]) == 0
    or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local holds = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, holds}
end
return {0, redis.call('pttl', KEYS[1])}
