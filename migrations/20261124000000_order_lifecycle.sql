-- The order lifecycle: a stored order is 'unpaid' until its pay_by, then
-- 'paid' (a payment in time), 'cancelled' or 'expired'; the last two give
-- the unit back. Every transition is one conditional UPDATE
-- (... WHERE status = 'unpaid'), so exactly one of them wins an order, and
-- the unit goes back in the transaction that closes it.

-- What a unit costs and how long a buyer has to pay for it.
-- `returned` counts units given back by cancelled and expired orders; it
-- only grows, and with initial_stock (raised by restocks) it makes the
-- voucher's epoch: a sold-out flag seen before a return or a restock
-- speaks for an older epoch and is ignored.
ALTER TABLE seckill_vouchers
    ADD COLUMN price_cents        BIGINT  NOT NULL DEFAULT 0 CHECK (price_cents >= 0),
    ADD COLUMN pay_within_seconds INTEGER NOT NULL DEFAULT 900
        CHECK (pay_within_seconds BETWEEN 1 AND 86400),
    ADD COLUMN returned           BIGINT  NOT NULL DEFAULT 0 CHECK (returned >= 0);

-- Orders of earlier versions were final when made: they count as paid.
ALTER TABLE voucher_orders
    ADD COLUMN status    TEXT        NOT NULL DEFAULT 'unpaid'
        CHECK (status IN ('unpaid', 'paid', 'cancelled', 'expired')),
    ADD COLUMN pay_by    TIMESTAMPTZ,
    ADD COLUMN paid_at   TIMESTAMPTZ,
    ADD COLUMN closed_at TIMESTAMPTZ;
UPDATE voucher_orders SET status = 'paid', pay_by = created_at, paid_at = created_at;
ALTER TABLE voucher_orders ALTER COLUMN pay_by SET NOT NULL;
ALTER TABLE voucher_orders ADD CHECK ((status = 'paid') = (paid_at IS NOT NULL));

-- One live order per user and voucher: a cancelled or expired order no
-- longer counts, so its user may buy again. Same name as before: the
-- store maps a violation of it to "already purchased".
DROP INDEX voucher_orders_user_voucher;
CREATE UNIQUE INDEX voucher_orders_user_voucher ON voucher_orders (user_id, voucher_id)
    WHERE status IN ('unpaid', 'paid');

-- The expiry sweep's queue: unpaid orders by deadline (small: an order
-- leaves it when it is paid, cancelled or expired).
CREATE INDEX voucher_orders_unpaid_pay_by ON voucher_orders (pay_by) WHERE status = 'unpaid';

-- Payment notifications, one row per payment id: a provider delivers at
-- least once, and a repeated delivery is answered from here.
CREATE TABLE payments (
    payment_id   TEXT        PRIMARY KEY CHECK (length(payment_id) BETWEEN 1 AND 64),
    order_id     BIGINT      NOT NULL REFERENCES voucher_orders (id),
    amount_cents BIGINT      NOT NULL,
    -- The order was not payable (paid already, cancelled or expired): the
    -- money goes back to the buyer.
    refund       BOOLEAN     NOT NULL,
    received_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX payments_order ON payments (order_id);

-- Units an async sale's closed orders gave back, not yet given back to
-- Redis's stock and buyers (an outbox, written in the transaction that
-- closes the order). Each instance's relay claims rows for a while
-- (visible_at moves into the future), applies them with a script that is
-- idempotent by order id, then deletes them; rows of a relay that died
-- become visible again and another one applies them.
CREATE TABLE stock_returns (
    order_id   BIGINT      PRIMARY KEY REFERENCES voucher_orders (id),
    voucher_id BIGINT      NOT NULL,
    user_id    BIGINT      NOT NULL,
    visible_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
