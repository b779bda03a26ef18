-- Removes a consumer from a stream's group, but only if it holds no
-- entry: the check and the removal in one step, so that an entry
-- delivered to it in between cannot vanish with it (XGROUP DELCONSUMER
-- drops a consumer's pending entries, which no one could claim after).
-- A live consumer removed this way is made again by its next read.
--
-- KEYS[1]  the stream
-- ARGV[1]  the group
-- ARGV[2]  the consumer
--
-- Returns 1  removed (or it was not there)
--         0  it holds entries: left for a claim
local held = redis.call('xpending', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #held > 0 then
  return 0
end
redis.call('xgroup', 'delconsumer', KEYS[1], ARGV[1], ARGV[2])
return 1
