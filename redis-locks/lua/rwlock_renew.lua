-- Renew one read-write hold's leases (the watchdog, for read-write locks):
-- the lock's hash and, for a reader, every one of its per-hold lease keys.
--
-- KEYS[1]  the lock's hash
-- KEYS[2]  prefix of the per-hold lease keys
-- ARGV[1]  the new lease in milliseconds
-- ARGV[2]  the owner
-- ARGV[3]  'read' or 'write'
--
-- Returns 1 when renewed, 0 when the owner no longer holds such a hold
local field = ARGV[2]
if ARGV[3] == 'write' then
    field = ARGV[2] .. ':write'
end
local holds = tonumber(redis.call('hget', KEYS[1], field))
if holds == nil then
    return 0
end
if redis.call('pttl', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('pexpire', KEYS[1], ARGV[1])
end
if ARGV[3] == 'read' then
    for i = holds, 1, -1 do
        redis.call('pexpire', KEYS[2] .. ':' .. ARGV[2] .. ':' .. i, ARGV[1])
    end
end
return 1
