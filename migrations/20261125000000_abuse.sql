-- Defences against one client taking what the crowd came for.

-- Units held for free are bounded: a user may hold, cancel and let expire
-- at most this many orders of one voucher (live, cancelled and expired
-- orders all count), so a script cannot keep a unit away from the crowd by
-- buying, cancelling and buying again. Vouchers of earlier versions had no
-- bound: they get the highest, new ones 3 unless the admin says otherwise.
ALTER TABLE seckill_vouchers
    ADD COLUMN max_orders_per_user INTEGER NOT NULL DEFAULT 1000
        CHECK (max_orders_per_user BETWEEN 1 AND 1000);
ALTER TABLE seckill_vouchers ALTER COLUMN max_orders_per_user SET DEFAULT 3;

-- The sale statement counts a user's orders of a voucher, whatever their
-- status, in this index (the unique one holds live orders only).
CREATE INDEX voucher_orders_user_voucher_all ON voucher_orders (user_id, voucher_id);

-- A user's purchase lock is now one per voucher (a user may buy two
-- vouchers at once), and each lock has its own fencing counter: tokens of
-- two locks cannot be compared, so the last token is kept per user and
-- voucher. Tokens written under the old per-user lock speak for no lock
-- that is taken any more.
DROP TABLE user_fences;
CREATE TABLE user_fences (
    user_id    BIGINT NOT NULL CHECK (user_id > 0),
    voucher_id BIGINT NOT NULL,
    token      BIGINT NOT NULL,
    PRIMARY KEY (user_id, voucher_id)
);
