-- Give back one read or write hold of a read-write lock; only its holder
-- can.
--
-- A read release ends that hold's lease (its member of the read holds,
-- see rwlock_read.lua), and only that one; the lock then lives as long as
-- the longest read hold left (expired holds are dropped on the way), or
-- as the writer's hold, and is deleted when nothing is left. A write
-- release that ends the writer's holds while the same owner still reads
-- turns the lock into a read lock (downgrade). Waiters hear when the lock
-- frees or turns to read.
--
-- KEYS[1]  the lock's hash
-- KEYS[2]  the lock's read holds
-- KEYS[3]  the lock's channel
-- ARGV[1]  'read' or 'write'
-- ARGV[2]  the owner
-- ARGV[3]  lease in milliseconds (renewed while write holds remain, never
--          shortened: the holds left may have longer ones)
-- ARGV[4]  for 'read', the hold's id
--
-- Returns -1  the owner holds no such hold (a read hold: not this one, or
--             its lease ran out): nothing changed
--        >=0  holds of this kind left to the owner
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
    return -1
end
local now = redis.call('time')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)

-- One hold fewer for `field`; the field goes with its last hold.
local function drop(field)
    local left = redis.call('hincrby', KEYS[1], field, -1)
    if left <= 0 then
        redis.call('hdel', KEYS[1], field)
    end
    return left
end

-- A read lock after a release: drops the read holds whose leases ran out;
-- the lock then lives as long as the longest hold left, or, with none
-- left, is deleted and its waiters told.
local function settle()
    for _, member in ipairs(redis.call('zrangebyscore', KEYS[2], '-inf', now)) do
        drop(string.match(member, '^[^:]*:(.*)$'))
    end
    redis.call('zremrangebyscore', KEYS[2], '-inf', now)
    local longest = redis.call('zrange', KEYS[2], -1, -1, 'withscores')
    if longest[2] then
        local left = string.format('%d', tonumber(longest[2]) - now)
        redis.call('pexpire', KEYS[1], left)
        redis.call('pexpire', KEYS[2], left)
    else
        redis.call('del', KEYS[1], KEYS[2])
        redis.call('publish', KEYS[3], 'released')
    end
end

if ARGV[1] == 'write' then
    local writer = ARGV[2] .. ':write'
    if mode ~= 'write' or redis.call('hexists', KEYS[1], writer) == 0 then
        return -1
    end
    local holds = drop(writer)
    if holds > 0 then
        if redis.call('pttl', KEYS[1]) < tonumber(ARGV[3]) then
            redis.call('pexpire', KEYS[1], ARGV[3])
        end
        return holds
    end
    redis.call('hset', KEYS[1], 'mode', 'read')
    settle()
    return 0
end

local member = ARGV[4] .. ':' .. ARGV[2]
local ends = tonumber(redis.call('zscore', KEYS[2], member))
if ends == nil or ends <= now or redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
    return -1
end
redis.call('zrem', KEYS[2], member)
local holds = math.max(drop(ARGV[2]), 0)
if mode == 'read' then
    settle()
end
return holds
