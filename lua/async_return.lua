-- Gives an async sale's units back to Redis: for each order that Postgres
-- closed (cancelled or expired, its units already back in its stock
-- there), the sale's stock grows by the order's units and the user leaves
-- the buyers, so the units are for sale again and the user may buy again. Exactly once per order:
-- the returned set remembers every order given back, so a return delivered
-- twice (a relay that died after this script and before it forgot the
-- return, or two relays at once) changes nothing the second time.
-- Reconciliation rebuilds the set with the stock (lua/async_reopen.lua): a
-- return it counted in Postgres's stock is in the set, one it did not is
-- not, so none is lost or counted twice across a Redis restart.
--
-- All keys carry the voucher's hash tag (one cluster slot).
--
-- KEYS[1]  the sale: a hash {stock, begin_ms, end_ms}; missing while the
--          sale is paused (the return waits for the reconciliation)
-- KEYS[2]  the buyers: a hash user id -> order id
-- KEYS[3]  the returned set: order ids given back
-- ARGV     order id, user id, units, order id, user id, units, ...
--
-- Returns the number of units given back now (0 or more), or -5 when the
--         sale is not loaded: nothing changed, try again later
if redis.call('exists', KEYS[1]) == 0 then
  return -5
end
local given = 0
for i = 1, #ARGV, 3 do
  local order, user, units = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if redis.call('sadd', KEYS[3], order) == 1 then
    redis.call('hincrby', KEYS[1], 'stock', units)
    if redis.call('hget', KEYS[2], user) == order then
      redis.call('hdel', KEYS[2], user)
    end
    given = given + tonumber(units)
  end
end
return given
