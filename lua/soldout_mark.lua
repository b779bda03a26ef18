-- Record whether a voucher is sold out, for every instance to see.
--
-- The flag is a hash {epoch, sold_out}. epoch is the voucher's
-- initial_stock plus the units its closed orders gave back, when the state
-- was observed: it only grows, because a restock and a returned unit raise
-- it. A late "sold out" from before a restock or a return carries a smaller
-- epoch and is ignored, so it can never hide stock that came back.
-- "open" is written by the instance that returned a unit, at the epoch the
-- return created. At an equal epoch "sold out" wins: stock seen at 0 at E
-- is newer news than the return that created E.
--
-- KEYS[1]  the voucher's flag key
-- ARGV[1]  epoch (initial_stock seen together with the state)
-- ARGV[2]  1 = sold out, 0 = open
-- ARGV[3]  lifetime of the flag in milliseconds
--
-- Returns 1 when the flag was written, 0 when a newer state was kept
local epoch = tonumber(ARGV[1])
local current = tonumber(redis.call('hget', KEYS[1], 'epoch'))
if current ~= nil and (current > epoch or (current == epoch and ARGV[2] == '0')) then
    return 0
end
redis.call('hset', KEYS[1], 'epoch', epoch, 'sold_out', ARGV[2])
redis.call('pexpire', KEYS[1], ARGV[3])
return 1
