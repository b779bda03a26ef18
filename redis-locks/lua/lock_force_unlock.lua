-- Free a lock whoever holds it (an operator's tool: the holder is not
-- asked), and tell its waiters.
--
-- KEYS[1]  the lock's key
-- KEYS[2]  the lock's channel
--
-- Returns 1 when a lock was deleted, 0 when it was free already
if redis.call('del', KEYS[1]) == 1 then
    redis.call('publish', KEYS[2], 'released')
    return 1
end
return 0
