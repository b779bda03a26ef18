-- Give back one read or write hold of a read-write lock; only its owner can.
--
-- A read release deletes that hold's lease key; the lock then lives as long
-- as the longest read hold left (expired readers are dropped on the way),
-- or as the writer's hold, and is deleted when nothing is left. A write
-- release that ends the writer's holds while the same owner still reads
-- turns the lock into a read lock (downgrade). Waiters hear when the lock
-- frees or turns to read.
--
-- KEYS[1]  the lock's hash
-- KEYS[2]  prefix of the per-hold lease keys
-- KEYS[3]  the lock's channel
-- ARGV[1]  'read' or 'write'
-- ARGV[2]  the owner
-- ARGV[3]  lease in milliseconds (renewed while write holds remain, never
--          shortened: the holds left may have longer ones)
--
-- Returns -1  the owner holds no such hold: nothing changed
--        >=0  holds of this kind left to the owner
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    return -1
end

if ARGV[1] == 'write' then
    local writer = ARGV[2] .. ':write'
    if mode ~= 'write' or redis.call('hexists', KEYS[1], writer) == 0 then
        return -1
    end
    local holds = redis.call('hincrby', KEYS[1], writer, -1)
    if holds > 0 then
        if redis.call('pttl', KEYS[1]) < tonumber(ARGV[3]) then
            redis.call('pexpire', KEYS[1], ARGV[3])
        end
        return holds
    end
    redis.call('hdel', KEYS[1], writer)
    if redis.call('hlen', KEYS[1]) == 1 then
        redis.call('del', KEYS[1])
    else
        redis.call('hset', KEYS[1], 'mode', 'read')
    end
    redis.call('publish', KEYS[3], 'released')
    return 0
end

if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return -1
end
local holds = redis.call('hincrby', KEYS[1], ARGV[2], -1)
redis.call('del', KEYS[2] .. ':' .. ARGV[2] .. ':' .. (holds + 1))
if holds == 0 then
    redis.call('hdel', KEYS[1], ARGV[2])
end
if mode == 'write' then
    return holds
end
-- Longest read hold left; readers whose holds all expired are dropped.
local longest = 0
for _, field in ipairs(redis.call('hkeys', KEYS[1])) do
    if field ~= 'mode' then
        local count = tonumber(redis.call('hget', KEYS[1], field))
        local alive = 0
        for i = count, 1, -1 do
            local ttl = redis.call('pttl', KEYS[2] .. ':' .. field .. ':' .. i)
            if ttl > 0 then
                alive = alive + 1
                if ttl > longest then
                    longest = ttl
                end
            end
        end
        if alive == 0 then
            redis.call('hdel', KEYS[1], field)
        end
    end
end
if longest > 0 then
    redis.call('pexpire', KEYS[1], longest)
    return holds
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[3], 'released')
return holds
