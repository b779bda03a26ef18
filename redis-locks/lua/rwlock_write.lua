-- Take the write hold of a read-write lock (reentrant for its owner). A
-- reader cannot upgrade: two readers upgrading at once would wait on each
-- other forever.
--
-- KEYS[1]  the lock's hash (see rwlock_read.lua)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  the owner
--
-- Returns {1, holds}  acquired; this owner's write holds after it
--         {0, pttl}   readers or another writer hold it
local writer = ARGV[2] .. ':write'
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    redis.call('hset', KEYS[1], 'mode', 'write', writer, 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, 1}
end
if mode == 'write' and redis.call('hexists', KEYS[1], writer) == 1 then
    local holds = redis.call('hincrby', KEYS[1], writer, 1)
    -- Never shortens the lease: the owner's other holds run on it.
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    return {1, holds}
end
return {0, redis.call('pttl', KEYS[1])}
