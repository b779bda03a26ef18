-- Renew one read-write hold's lease (the watchdog, for read-write locks):
-- the writer's, or one read hold's (its member of the read holds).
--
-- KEYS[1]  the lock's hash
-- KEYS[2]  the lock's read holds (see rwlock_read.lua)
-- ARGV[1]  the new lease in milliseconds
-- ARGV[2]  the owner
-- ARGV[3]  'read' or 'write'
-- ARGV[4]  for 'read', the hold's id
--
-- Returns 1 when renewed, 0 when the owner no longer holds such a hold
-- (for a read hold: this one, its lease not yet run out)
local lease = tonumber(ARGV[1])
if ARGV[3] == 'write' then
    if redis.call('hexists', KEYS[1], ARGV[2] .. ':write') == 0 then
        return 0
    end
else
    local member = ARGV[4] .. ':' .. ARGV[2]
    local ends = tonumber(redis.call('zscore', KEYS[2], member))
    local now = redis.call('time')
    now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    if ends == nil or ends <= now or redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
        return 0
    end
    if ends < now + lease then
        redis.call('zadd', KEYS[2], string.format('%d', now + lease), member)
    end
end
for _, key in ipairs(KEYS) do
    if redis.call('pttl', key) < lease then
        redis.call('pexpire', key, lease)
    end
end
return 1
