-- Leave a fair lock's queue (the waiter gives up), and wake the others:
-- if the leaver stood first, the next in line may take a free lock now.
--
-- KEYS[1]  the queue
-- KEYS[2]  the waiters' deadlines
-- KEYS[3]  the lock's channel
-- ARGV[1]  the owner
--
-- Returns 1 when the owner was waiting, 0 otherwise
local removed = redis.call('lrem', KEYS[1], 0, ARGV[1])
redis.call('zrem', KEYS[2], ARGV[1])
if removed > 0 then
    redis.call('publish', KEYS[3], 'released')
    return 1
end
return 0
