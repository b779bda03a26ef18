-- Take a read hold on a read-write lock: many readers, or one writer (who
-- may also read, which is how a writer downgrades).
--
-- The lock is a hash: 'mode' = 'read' | 'write', each reader's hold count
-- under its owner, the writer's under '<owner>:write'. Every read hold has
-- its own lease: a member '<hold id>:<owner>' of the lock's sorted set of
-- read holds, scored by when that lease ends (ms, Redis's clock). So one
-- reader's expired hold does not keep the lock from a writer once the
-- others are gone, and giving back one hold ends that hold's lease, not
-- another's of the same owner; the hash's own lease is the longest.
--
-- KEYS[1]  the lock's hash
-- KEYS[2]  the lock's read holds (a sorted set, same hash tag)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  the owner
-- ARGV[3]  the hold's id (unique to the guard that will hold it)
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
    local now = redis.call('time')
    local ends = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(ARGV[1])
    redis.call('zadd', KEYS[2], string.format('%d', ends), ARGV[3] .. ':' .. ARGV[2])
    -- Never shortens a lease: the other holds run on it.
    for _, key in ipairs(KEYS) do
        if redis.call('pttl', key) < tonumber(ARGV[1]) then
            redis.call('pexpire', key, ARGV[1])
        end
    end
    return {1, holds}
end
return {0, redis.call('pttl', KEYS[1])}
