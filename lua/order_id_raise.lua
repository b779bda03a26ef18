-- Raise a day's order-id counter to at least a floor.
--
-- Redis without persistence forgets the counter when it restarts (and a
-- promoted replica may lag it): the next INCR would hand out ids that are
-- already taken. The caller reads the highest sequence used that day from
-- Postgres, which keeps every committed id, and raises the counter to it;
-- a counter that is higher already is left alone, so concurrent raises and
-- draws never move it back.
--
-- KEYS[1]  the day's counter key, icr:order:{yyyy:MM:dd}
-- ARGV[1]  the floor: the highest sequence already used that day
-- ARGV[2]  lifetime of the counter key in seconds, if this creates it
--
-- Returns the counter after the call
local floor = tonumber(ARGV[1])
local current = tonumber(redis.call('get', KEYS[1]) or '0')
if current >= floor then
    return current
end
if redis.call('exists', KEYS[1]) == 1 then
    redis.call('set', KEYS[1], floor, 'KEEPTTL')
else
    redis.call('set', KEYS[1], floor, 'EX', ARGV[2])
end
return floor
