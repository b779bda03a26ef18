-- Take a fair (first come, first served) reentrant lock, or join its queue.
--
-- Same hash as the reentrant lock (owner -> holds, with a lease), plus a
-- queue of waiting owners and, for each, the time until which it counts as
-- waiting: the end of its wait, but at most ARGV[5] ms after its last
-- attempt (its heartbeat: a live waiter tries again at least every third
-- of that). A waiter past that time while it stands first (it crashed, or
-- gave up without leaving) is skipped, so a dead waiter blocks the queue
-- for a few seconds at most, not for the whole wait it asked for.
--
-- KEYS[1]  the lock's key
-- KEYS[2]  the lock's fencing-token key
-- KEYS[3]  the queue (list of owners, first in line first)
-- KEYS[4]  the waiters' deadlines (sorted set: owner -> unix ms)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  the owner
-- ARGV[3]  lifetime of the fencing-token key in milliseconds
-- ARGV[4]  how long this owner will still wait, in milliseconds
-- ARGV[5]  how long after an attempt a waiter still counts as waiting
--          without another (its heartbeat window), in milliseconds
--
-- Returns {1, holds, token}  acquired
--         {0, wake_ms, 0}    not this owner's turn: retry in at most wake_ms
--                            (or on the lock's release message); never
--                            more than a third of the heartbeat window
-- The token in a fencing-token key's value ('token' or 'token request',
-- see lock_acquire.lua); 0 for none.
local function token_in(value)
    return tonumber(string.match(value or '', '^%d+') or '0')
end

local time = redis.call('time')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now = math.floor(now_us / 1000)

-- Skip waiters whose wait is over.
while true do
    local first = redis.call('lindex', KEYS[3], 0)
    if not first then break end
    local deadline = tonumber(redis.call('zscore', KEYS[4], first))
    if deadline ~= nil and deadline > now then break end
    redis.call('lpop', KEYS[3])
    redis.call('zrem', KEYS[4], first)
end

if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
    local holds = redis.call('hincrby', KEYS[1], ARGV[2], 1)
    -- Never shortens the lease: the owner's other holds run on it.
    if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
        redis.call('pexpire', KEYS[1], ARGV[1])
    end
    return {1, holds, token_in(redis.call('get', KEYS[2]))}
end

local first = redis.call('lindex', KEYS[3], 0)
if redis.call('exists', KEYS[1]) == 0 and (first == false or first == ARGV[2]) then
    if first == ARGV[2] then
        redis.call('lpop', KEYS[3])
        redis.call('zrem', KEYS[4], ARGV[2])
    end
    local last = token_in(redis.call('get', KEYS[2]))
    local token = math.max(last + 1, now_us)
    redis.call('set', KEYS[2], string.format('%d', token), 'PX', ARGV[3])
    redis.call('hincrby', KEYS[1], ARGV[2], 1)
    redis.call('pexpire', KEYS[1], ARGV[1])
    return {1, 1, token}
end

-- Not our turn: take a place in the line (once); each attempt moves the
-- time this waiter counts as waiting on.
local alive = now + math.min(tonumber(ARGV[4]), tonumber(ARGV[5]))
if redis.call('zscore', KEYS[4], ARGV[2]) == false then
    redis.call('rpush', KEYS[3], ARGV[2])
end
redis.call('zadd', KEYS[4], alive, ARGV[2])
local beat = math.max(math.floor(tonumber(ARGV[5]) / 3), 1)
local longest = tonumber(redis.call('zrange', KEYS[4], -1, -1, 'WITHSCORES')[2]) - now
redis.call('pexpire', KEYS[3], math.max(longest, 1))
redis.call('pexpire', KEYS[4], math.max(longest, 1))

-- When to look again without a message: when the holder's lease ends, or,
-- if the lock is free and the first waiter has not taken it, when that
-- waiter's wait ends.
local pttl = redis.call('pttl', KEYS[1])
if pttl > 0 then
    return {0, math.min(pttl, beat), 0}
end
first = redis.call('lindex', KEYS[3], 0)
local head_deadline = tonumber(redis.call('zscore', KEYS[4], first))
return {0, math.min(math.max(head_deadline - now, 1), beat), 0}
