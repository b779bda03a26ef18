-- Async sales' purchases of one voucher, in one atomic step for a batch of
-- them (those that arrived at an instance while its previous call was
-- under way): the window, each user's earlier order, the stock; then, for
-- each purchase that passes, the decrement, the buyer and the order
-- appended to the voucher's stream, which a consumer group writes to
-- Postgres. Nothing of a purchase happens unless all of it does. One call
-- for many purchases reads the sale and the clock once and writes the
-- stock and the buyers once.
--
-- All KEYS[1..3] carry the voucher's hash tag, so on a Redis Cluster they
-- live in one slot and this script runs on one node.
--
-- KEYS[1]    the sale: a hash {stock, begin_ms, end_ms}; missing while the
--            sale is not loaded (a Redis that lost it, or a reconciliation
--            under way): the sale pauses rather than sell stock twice
-- KEYS[2]    the buyers: a hash user id -> order id
-- KEYS[3]    the stream of accepted orders
-- KEYS[4]    the orders per user: a hash user id -> how many orders of the
--            voucher Redis accepted for the user, ever (cancelled and
--            expired ones count: the bound on units held for free)
-- KEYS[4+i]  optional, for every purchase or none: the lookup hash of the
--            i-th purchase's order (field order id -> "<voucher>:<user>:
--            <now_ms>", for GET /orders/{id} while pending; one hash per
--            hour in which ids were drawn, so the purchases of one call
--            share one); given on a single Redis, where it saves a round
--            trip (on a cluster it is in another slot and the caller
--            writes it)
-- ARGV[1]    the voucher id (for the lookups)
-- ARGV[2]    the lookup hashes' life in seconds after their last write
-- ARGV[3]    the voucher's max_orders_per_user
-- ARGV[3i+1] the i-th purchase's user id
-- ARGV[3i+2] the order id drawn for it (lua/order_id.lua)
-- ARGV[3i+3] the units it asks for, all or nothing (1 or more)
--
-- Returns one answer per purchase, in order:
--         {1, now_ms}       accepted: the order is in the stream
--         {-1}              the sale has not begun (Redis's clock)
--         {-2}              the sale is over
--         {-3}              no stock left
--         {-4, order_id}    this user holds this order already (also when
--                           an earlier purchase of the same call took it)
--         {-5}              the sale is not loaded: answer 503
--         {-6}              this user has max_orders_per_user orders of it
--         {-7, units}       fewer units than it asks for are left (this
--                           many, at its turn); a later, smaller ask of the
--                           same call may still be served
local n = (#ARGV - 3) / 3
local max_orders = tonumber(ARGV[3])
local answers = {}
local sale = redis.call('hmget', KEYS[1], 'stock', 'begin_ms', 'end_ms')
local verdict, now
if not sale[1] or not sale[2] or not sale[3] then
    verdict = {-5}
else
    local t = redis.call('time')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if now < tonumber(sale[2]) then
        verdict = {-1}
    elseif now >= tonumber(sale[3]) then
        verdict = {-2}
    end
end
if verdict then
    for i = 1, n do
        answers[i] = verdict
    end
    return answers
end

local users = {}
for i = 1, n do
    users[i] = ARGV[3 * i + 1]
end
local held = redis.call('hmget', KEYS[2], unpack(users))
local counted = redis.call('hmget', KEYS[4], unpack(users))
local added = {}
local stock = tonumber(sale[1])
local taken = {}
local sold = 0
local buyers = {}
local lookups = #KEYS > 4
local lookup_fields = {}
for i = 1, n do
    local user, order = ARGV[3 * i + 1], ARGV[3 * i + 2]
    local units = tonumber(ARGV[3 * i + 3])
    local had = held[i] or taken[user]
    if had then
        answers[i] = {-4, had}
    elseif (tonumber(counted[i]) or 0) + (added[user] or 0) >= max_orders then
        answers[i] = {-6}
    elseif stock <= 0 then
        answers[i] = {-3}
    elseif stock < units then
        answers[i] = {-7, stock}
    else
        stock = stock - units
        sold = sold + units
        taken[user] = order
        added[user] = (added[user] or 0) + 1
        redis.call('hincrby', KEYS[4], user, 1)
        buyers[#buyers + 1] = user
        buyers[#buyers + 1] = order
        redis.call('xadd', KEYS[3], '*', 'order', order, 'user', user, 'at', now, 'units', units)
        if lookups then
            local key = KEYS[4 + i]
            local fields = lookup_fields[key]
            if not fields then
                fields = {}
                lookup_fields[key] = fields
            end
            fields[#fields + 1] = order
            fields[#fields + 1] = ARGV[1] .. ':' .. user .. ':' .. now .. ':' .. units
        end
        answers[i] = {1, now}
    end
end
if #buyers > 0 then
    redis.call('hincrby', KEYS[1], 'stock', -sold)
    redis.call('hset', KEYS[2], unpack(buyers))
end
for key, fields in pairs(lookup_fields) do
    redis.call('hset', key, unpack(fields))
    redis.call('expire', key, ARGV[2])
end
return answers
