-- Draw the next order-id sequence numbers for one UTC day.
--
-- Redis's own clock stamps the ids, so every instance shares one clock and
-- ids come out strictly increasing in the order Redis runs this script.
-- The caller names the day's counter key from its own clock; when Redis's
-- clock says another day (skew, or a call right at midnight) nothing is
-- counted and the caller retries with the day Redis reported. A batch of
-- purchases draws all its ids in one call (INCRBY).
--
-- KEYS[1]  the day's counter key, icr:order:{yyyy:MM:dd}
-- ARGV[1]  unix seconds at 00:00:00 UTC of that day
-- ARGV[2]  lifetime of the counter key in seconds (longer than a day)
-- ARGV[3]  how many sequence numbers to draw (at least 1)
--
-- Returns {now, n}  now: Redis's unix seconds; n: the last number drawn
--                   (the batch is n - count + 1 .. n), or 0 when now is not
--                   within the named day
local now = tonumber(redis.call('time')[1])
local day = tonumber(ARGV[1])
if now < day or now >= day + 86400 then
    return {now, 0}
end
local count = tonumber(ARGV[3])
local n = redis.call('incrby', KEYS[1], count)
if n == count then
    redis.call('expire', KEYS[1], ARGV[2])
end
return {now, n}
