-- Take a read hold on a read-write lock: many readers, or one writer (who
-- may also read, which is how a writer downgrades).
--
-- The lock is a hash: 'mode' = 'read' | 'write', each reader's hold count
-- under its owner, the writer's under '<owner>:write'. Every read hold has
-- its own lease key, '<timeouts>:<owner>:<n>', so that one reader's expired
-- hold does not keep the lock from a writer once the others are gone; the
-- hash's own lease is the longest of them.
--
-- KEYS[1]  the lock's hash
-- KEYS[2]  prefix of the per-hold lease keys (same hash tag)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  the owner
--
-- Returns {1, holds}  acquired; this owner's read holds after it
--         {0, pttl}   a writer (someone else) holds it; pttl = lease left
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false
    or mode == 'read'
    or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2] .. ':write') == 1) then
    if mode == false then
        redis.call('hset', KEYS[1], 'mode', 'read')
    end
    local holds = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('set', KEYS[2] .. ':' .. ARGV[2] .. ':' .. holds, 1, 'PX', ARGV[1])
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    return {1, holds}
end
return {0, redis.call('pttl', KEYS[1])}
