-- Pauses an async sale for a reconciliation: the sale hash goes (the
-- purchase script answers "not loaded", 503, and appends nothing) and the
-- reconciliation's token is recorded. Only the reconciliation whose token
-- is still recorded may reopen the sale (lua/async_reopen.lua): one that
-- started later took over, and its snapshot, read after its own pause, is
-- the exact one. Without the token, an older reconciliation finishing last
-- would set the stock from a snapshot taken before purchases it never saw.
--
-- All keys carry the voucher's hash tag (one cluster slot).
--
-- KEYS[1]  the sale: a hash {stock, begin_ms, end_ms}
-- KEYS[2]  the reconciliation under way: its token
-- ARGV[1]  this reconciliation's token (unique)
-- ARGV[2]  how long the token lives, in ms: a reconciliation that died
--          stops counting as under way after this
-- ARGV[3]  "": always. A number n: only if no reconciliation is under way
--          and the sale is missing (a sale just created, or one that Redis
--          lost, or that a failed reconciliation left paused) or was built
--          from an initial stock below n (a restock whose rebuild failed);
--          a sale hash without its initial stock counts as built from n
--
-- Returns 1  paused, the token recorded
--         0  nothing done (ARGV[3] a number): the sale is loaded and current
--         2  nothing done (ARGV[3] a number): a reconciliation is under way
if ARGV[3] ~= '' then
  local initial = redis.call('hmget', KEYS[1], 'stock', 'initial')
  if initial[1] and tonumber(initial[2] or ARGV[3]) >= tonumber(ARGV[3]) then
    return 0
  end
  if redis.call('exists', KEYS[2]) == 1 then
    return 2
  end
end
redis.call('del', KEYS[1])
redis.call('set', KEYS[2], ARGV[1], 'px', ARGV[2])
return 1
