-- Renew the leases of many held locks at once (the watchdog's batch).
--
-- KEYS[i]    a lock's key
-- ARGV[1]    the new lease in milliseconds
-- ARGV[i+1]  the owner that must still hold KEYS[i]
--
-- Returns an array: for each lock, 1 when its lease was renewed, 0 when
-- the owner no longer holds it (it expired, was force-unlocked, or Redis
-- lost it): that holder must be told at once.

-- Sets the lease of `key` to `lease` ms unless more is left: a hold taken
-- or given back with a shorter lease than one already running must not cut
-- the other holds short (the key would expire under them).
local function extend(key, lease)
    if redis.call('pttl', key) < tonumber(lease) then
        redis.call('pexpire', key, lease)
    end
end

local renewed = {}
for i, key in ipairs(KEYS) do
    if redis.call('hexists', key, ARGV[i + 1]) == 1 then
        extend(key, ARGV[1])
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
