-- An async sale's purchase, in one atomic step: the window, the user's
-- earlier order, the stock; then the decrement, the buyer and the order
-- appended to the voucher's stream, which a consumer group writes to
-- Postgres. Nothing of it happens unless all of it does.
--
-- All keys carry the voucher's hash tag, so on a Redis Cluster they live
-- in one slot and this script runs on one node.
--
-- KEYS[1]  the sale: a hash {stock, begin_ms, end_ms}; missing while the
--          sale is not loaded (a Redis that lost it, or a reconciliation
--          under way): the sale pauses rather than sell stock twice
-- KEYS[2]  the buyers: a hash user id -> order id
-- KEYS[3]  the stream of accepted orders
-- KEYS[4]  optional: the order's lookup key ("<voucher>:<user>:<now_ms>",
--          for GET /orders/{id} while pending); given on a single Redis,
--          where it saves a round trip (on a cluster it is in another
--          slot and the caller writes it)
-- ARGV[1]  the user id
-- ARGV[2]  the order id drawn for this purchase (lua/order_id.lua)
-- ARGV[3]  with KEYS[4]: the voucher id
-- ARGV[4]  with KEYS[4]: the lookup key's life in seconds
--
-- Returns {1, now_ms}       accepted: the order is in the stream
--         {-1}              the sale has not begun (Redis's clock)
--         {-2}              the sale is over
--         {-3}              no stock left
--         {-4, order_id}    this user holds this order already
--         {-5}              the sale is not loaded: answer 503
local sale = redis.call('hmget', KEYS[1], 'stock', 'begin_ms', 'end_ms')
if not sale[1] or not sale[2] or not sale[3] then
    return {-5}
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < tonumber(sale[2]) then
    return {-1}
end
if now >= tonumber(sale[3]) then
    return {-2}
end
local held = redis.call('hget', KEYS[2], ARGV[1])
if held then
    return {-4, held}
end
if tonumber(sale[1]) <= 0 then
    return {-3}
end
redis.call('hincrby', KEYS[1], 'stock', -1)
redis.call('hset', KEYS[2], ARGV[1], ARGV[2])
redis.call('xadd', KEYS[3], '*', 'order', ARGV[2], 'user', ARGV[1], 'at', now)
if KEYS[4] then
    redis.call('set', KEYS[4], ARGV[3] .. ':' .. ARGV[1] .. ':' .. now, 'EX', ARGV[4])
end
return {1, now}
