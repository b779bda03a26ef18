-- A user's place in a voucher's waiting room, and the room's serving
-- counter, in one step: joins the user if they are not in the room yet
-- (once: joining again finds the same place), moves the counter on by the
-- time passed at the room's pace, and says whether the user is admitted.
--
-- Before the sale begins (Redis's clock) joiners go into the pre-queue
-- with a random draw made by the service; nobody has a place yet. From the
-- start, a pre-queue joiner's place is the rank of their draw (so arriving
-- early or fast buys nothing), and a later joiner's is the pre-queue's size
-- plus their order of arrival. The pre-queue stops growing at the start,
-- so every instance computes the same places.
--
-- The counter ("serving": places up to it are admitted) advances by
-- admit_per_second for the time since it last moved, never past the places
-- handed out (an empty room does not bank admissions for a later crowd),
-- and not at all while the voucher is sold out: then it only keeps the
-- time, so that admission resumes, without a burst, when units come back.
-- The part of an admission that the time so far has earned is kept
-- ("credit", in thousandths of one), so that the pace is exact however
-- often the script runs: rounding each step's time to a whole millisecond
-- admitted 500/s in a room of 999/s asked every millisecond.
--
-- All keys carry the voucher's hash tag (one cluster slot).
--
-- KEYS[1]  the room: a hash {serving, last_ms, credit, late}
-- KEYS[2]  the pre-queue: a sorted set user -> draw
-- KEYS[3]  later joiners: a hash user -> order of arrival (1, 2, ...)
-- KEYS[4]  admissions: a hash user -> when Redis's clock first saw the
--          user admitted (ms)
-- KEYS[5]  optional: an async sale's hash {stock, ...}; sold out when its
--          stock is 0
-- ARGV[1]  the user id; empty: only move the counter on and read it (a
--          poll answered from the service's memory refreshes it so)
-- ARGV[2]  the user's draw, should they join the pre-queue (a random
--          integer below 2^52)
-- ARGV[3]  the sale's begin time (ms)
-- ARGV[4]  admit_per_second
-- ARGV[5]  1 when the service knows the voucher sold out, else 0
-- ARGV[6]  the keys' life in seconds (past the sale's end)
-- ARGV[7]  the admission window (ms): an admission older than this is
--          over, and its user, asking again, is placed again at the back
--          (a later joiner's order of arrival, which takes precedence over
--          a pre-queue draw: the draw stays, so nobody else's rank moves)
--
-- Returns {place, serving, admitted_ms, now_ms, placed, sold_out}: place
--         -1 before the start (in the pre-queue, not placed yet);
--         admitted_ms 0 unless admitted; placed = places handed out so
--         far; sold_out 1 or 0
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local user = ARGV[1]
local begin = tonumber(ARGV[3])
local rate = tonumber(ARGV[4])
local life = ARGV[6]

local function keep(key)
    redis.call('expire', key, life)
end

local peek = user == ''
local drawn = false
if not peek then
    drawn = redis.call('zscore', KEYS[2], user)
end
if now < begin then
    if not drawn and not peek then
        redis.call('zadd', KEYS[2], 'NX', ARGV[2], user)
        keep(KEYS[2])
    end
    return {-1, 0, 0, now, 0, 0}
end

local sold_out = ARGV[5] == '1'
if KEYS[5] then
    local stock = tonumber(redis.call('hget', KEYS[5], 'stock'))
    if stock and stock <= 0 then
        sold_out = true
    end
end

local state = redis.call('hmget', KEYS[1], 'serving', 'last_ms', 'late', 'credit')
local serving = tonumber(state[1]) or 0
local last = tonumber(state[2]) or begin
local late = tonumber(state[3]) or 0
local credit = tonumber(state[4]) or 0
local early = redis.call('zcard', KEYS[2])
local placed = early + late

if sold_out or serving >= placed then
    -- Nothing to admit: the clock moves, the counter does not, and no
    -- credit is banked.
    credit = 0
elseif now > last then
    -- Whole numbers throughout (below 2^53 for any window and pace).
    credit = credit + (now - last) * rate
    local steps = math.floor(credit / 1000)
    if steps > 0 then
        serving = math.min(serving + steps, placed)
        credit = credit - steps * 1000
        if serving >= placed then
            credit = 0
        end
    end
end
last = math.max(last, now)

local function save()
    redis.call('hset', KEYS[1], 'serving', serving, 'last_ms', last, 'late', late, 'credit', credit)
    keep(KEYS[1])
end

if peek then
    save()
    return {-1, serving, 0, now, placed, sold_out and 1 or 0}
end

-- A place at the back, after everyone placed so far.
local function place_last()
    late = late + 1
    redis.call('hset', KEYS[3], user, late)
    keep(KEYS[3])
    placed = placed + 1
    return early + late
end

local place
local seq = tonumber(redis.call('hget', KEYS[3], user))
if seq then
    place = early + seq
elseif drawn then
    place = redis.call('zrank', KEYS[2], user) + 1
else
    place = place_last()
end

local admitted = 0
if place <= serving then
    admitted = tonumber(redis.call('hget', KEYS[4], user))
    if admitted and now - admitted >= tonumber(ARGV[7]) then
        -- The admission's window is over: back of the room, waiting.
        redis.call('hdel', KEYS[4], user)
        place = place_last()
        admitted = 0
    elseif not admitted and not sold_out then
        -- Sold out, the place waits for units to come back: its window
        -- starts once it can buy.
        admitted = now
        redis.call('hset', KEYS[4], user, now)
        keep(KEYS[4])
    end
    -- (nil would end the answer's array here)
    admitted = admitted or 0
end
save()
local out = 0
if sold_out then
    out = 1
end
return {place, serving, admitted, now, placed, out}
