-- Reopens an async sale after a reconciliation, if no later one took over
-- (lua/async_pause.lua): the buyers, the returned orders and the orders per
-- user rebuilt under staging keys replace the live ones, and the sale hash
-- is set, in one step.
--
-- All keys carry the voucher's hash tag (one cluster slot).
--
-- KEYS[1]  the sale: a hash {stock, begin_ms, end_ms, initial}
-- KEYS[2]  the buyers: a hash user id -> order id
-- KEYS[3]  the rebuilt buyers (missing when there are none)
-- KEYS[4]  the reconciliation under way: its token
-- KEYS[5]  the returned set: order ids whose unit Redis's stock holds
--          again (lua/async_return.lua)
-- KEYS[6]  the rebuilt returned set (missing when there are none)
-- KEYS[7]  the orders per user: a hash user id -> orders of the voucher
-- KEYS[8]  the rebuilt orders per user (missing when there are none)
-- ARGV[1]  this reconciliation's token
-- ARGV[2]  the stock to sell from
-- ARGV[3]  the window's first millisecond
-- ARGV[4]  the window's end, in ms
-- ARGV[5]  the voucher's initial stock in the snapshot (a restock raises
--          it; a sale built from a lower one is rebuilt: async_pause.lua)
--
-- Returns 1  reopened
--         0  another reconciliation took over (or this one outlived its
--            token): nothing changed but the staging keys, deleted
if redis.call('get', KEYS[4]) ~= ARGV[1] then
  redis.call('del', KEYS[3], KEYS[6], KEYS[8])
  return 0
end
local function swap(staged, live)
  if redis.call('exists', staged) == 1 then
    redis.call('rename', staged, live)
    redis.call('persist', live)
  else
    redis.call('del', live)
  end
end
swap(KEYS[3], KEYS[2])
swap(KEYS[6], KEYS[5])
swap(KEYS[8], KEYS[7])
redis.call('hset', KEYS[1], 'stock', ARGV[2], 'begin_ms', ARGV[3], 'end_ms', ARGV[4],
  'initial', ARGV[5])
redis.call('del', KEYS[4])
return 1
