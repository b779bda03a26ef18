-- The flash-sale schema. Correctness lives here as much as in the code:
-- the CHECKs and the unique index hold even if every layer above fails.

-- What can be sold. The sale itself (stock, time window) is in
-- seckill_vouchers so that ordinary vouchers could share this table.
CREATE TABLE vouchers (
    id          BIGSERIAL PRIMARY KEY,
    title       TEXT        NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One row per flash sale. `stock` is the only hot row of a sale: every
-- purchase runs `UPDATE ... SET stock = stock - 1 WHERE ... AND stock > 0`
-- on it, so the row lock serialises buyers and the predicate, checked
-- against the latest committed value after the lock is taken, refuses the
-- decrement that would go below zero. The CHECK is the backstop.
-- `initial_stock` only grows (restocks add to both columns), which keeps
-- `orders + stock = initial_stock` true and lets the sold-out flag in Redis
-- tell an old "sold out" from one after a restock.
CREATE TABLE seckill_vouchers (
    voucher_id     BIGINT      PRIMARY KEY REFERENCES vouchers (id),
    initial_stock  INTEGER     NOT NULL CHECK (initial_stock >= 0),
    stock          INTEGER     NOT NULL CHECK (stock >= 0),
    begin_time     TIMESTAMPTZ NOT NULL,
    end_time       TIMESTAMPTZ NOT NULL,
    CHECK (stock <= initial_stock),
    CHECK (end_time > begin_time)
);

-- One row per unit sold. The id comes from the application's generator
-- (seconds since 2022-01-01 << 32 | a per-day Redis counter), not from a
-- sequence: ids stay unique across shards and do not reveal daily volume
-- to a customer who compares two of them a day apart.
CREATE TABLE voucher_orders (
    id          BIGINT      PRIMARY KEY,
    user_id     BIGINT      NOT NULL CHECK (user_id > 0),
    voucher_id  BIGINT      NOT NULL REFERENCES vouchers (id),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One order per user and voucher: the last line of defence behind the
-- per-user lock. If a lock lease ever runs out mid-purchase, the second
-- insert fails here and its stock decrement rolls back with it.
CREATE UNIQUE INDEX voucher_orders_user_voucher ON voucher_orders (user_id, voucher_id);

-- The admin listing and the stats read orders by voucher.
CREATE INDEX voucher_orders_voucher ON voucher_orders (voucher_id);
