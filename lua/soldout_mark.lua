-- Record whether a voucher is sold out, for every instance to see.
--
-- The flag is a hash {epoch, sold_out}. epoch is the voucher's
-- initial_stock when the state was observed: it only grows, because adding
-- stock raises it. A late "sold out" from before a restock carries a smaller
-- epoch and is ignored, so it can never hide stock that was added back.
-- At an equal epoch "sold out" wins: "open" at epoch E is written by the
-- restock that created E, and stock seen at 0 at E is newer news.
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
