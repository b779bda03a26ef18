-- The lab's tables (see LAB.md). They hold the sales made by the lab's
-- deliberately flawed strategies, and they lack, on purpose, every safety
-- constraint of the real tables: no CHECK on stock, no unique index on
-- (user, voucher). An anomaly of a strategy then lands in real rows (a
-- negative stock, two orders of one user) instead of being stopped by the
-- schema, which is what the lab is there to show. Only the lab routes
-- (SECKILL_LAB=1) touch them; the production route never does.

-- A lab sale: stock only. Lab vouchers have no time window; none of the
-- failures the lab shows has anything to do with time.
CREATE TABLE lab_vouchers (
    id                BIGSERIAL PRIMARY KEY,
    initial_stock     INTEGER NOT NULL,
    stock             INTEGER NOT NULL,             -- may go below zero
    -- Lock releases that deleted another request's lock (seen by the
    -- strategies that delete with a plain delete).
    foreign_releases  INTEGER NOT NULL DEFAULT 0
);

-- Units sold; a user may appear twice, which is the point.
CREATE TABLE lab_orders (
    id          BIGSERIAL PRIMARY KEY,
    voucher_id  BIGINT      NOT NULL REFERENCES lab_vouchers (id),
    user_id     BIGINT      NOT NULL,
    strategy    TEXT        NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- Not unique: the "already bought?" checks run against it.
CREATE INDEX lab_orders_user_voucher ON lab_orders (voucher_id, user_id);

-- The `fenced` strategy's fencing tokens: the last token under which each
-- user's purchase of a lab voucher was written (as user_fences does for the
-- real sale, keyed by voucher too because lab locks are per voucher).
CREATE TABLE lab_fences (
    voucher_id  BIGINT NOT NULL,
    user_id     BIGINT NOT NULL,
    token       BIGINT NOT NULL,
    PRIMARY KEY (voucher_id, user_id)
);
