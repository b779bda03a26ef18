-- The lab's Redis-stock check-and-decrement (`redis_lua`, `redis_stream`;
-- see LAB.md section 10), in one atomic step: the stock, the user's earlier
-- purchase, then the decrement and the buyer; for the stream design, the
-- order appended to the voucher's stream as well. Lab only: the service's
-- own async sales run lua/async_purchase.lua.
--
-- All keys carry the lab voucher's hash tag (one cluster slot).
--
-- KEYS[1]  the stock (a counter)
-- KEYS[2]  the buyers (a set of user ids)
-- KEYS[3]  optional: the stream of accepted orders (`redis_stream`)
-- ARGV[1]  the user id
-- ARGV[2]  "1" when the order is marked to crash the first writer that
--          reads it (stall_at=crash), else "0"
--
-- Returns  1   accepted
--         -1   no stock left
--         -2   this user bought already
local stock = tonumber(redis.call('get', KEYS[1]) or '0')
if stock <= 0 then
    return -1
end
if redis.call('sismember', KEYS[2], ARGV[1]) == 1 then
    return -2
end
redis.call('decr', KEYS[1])
redis.call('sadd', KEYS[2], ARGV[1])
if KEYS[3] then
    redis.call('xadd', KEYS[3], '*', 'user', ARGV[1], 'crash', ARGV[2])
end
return 1
