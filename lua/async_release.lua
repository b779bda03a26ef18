-- Ends a reconciliation that failed after it paused the sale
-- (lua/async_pause.lua): its token stops counting as under way, so the
-- next reconciliation, or the loading of a sale not yet seen loaded, need
-- not wait for the token to expire; its staged buyers, returned set and
-- orders per user go. The sale stays
-- paused: only a reconciliation that completes reopens it.
--
-- All keys carry the voucher's hash tag (one cluster slot).
--
-- KEYS[1]  the reconciliation under way: its token
-- KEYS[2]  this reconciliation's staged buyers
-- KEYS[3]  this reconciliation's staged returned set
-- KEYS[4]  this reconciliation's staged orders per user
-- ARGV[1]  this reconciliation's token
--
-- Returns 1  released
--         0  a later reconciliation took over: its token stays
redis.call('del', KEYS[2], KEYS[3], KEYS[4])
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('del', KEYS[1])
return 1
