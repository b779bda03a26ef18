-- Units: "limit N per customer". A voucher says how many units one order
-- may take (1, the default, is one unit per order as before); an order
-- carries how many it took, all or nothing. Still one live order per user
-- and voucher: a user's units are that order's. Every balance counts units:
-- live orders' quantities + stock = initial stock.
ALTER TABLE seckill_vouchers
    ADD COLUMN max_units_per_user INTEGER NOT NULL DEFAULT 1
        CHECK (max_units_per_user BETWEEN 1 AND 100);

ALTER TABLE voucher_orders
    ADD COLUMN quantity INTEGER NOT NULL DEFAULT 1 CHECK (quantity BETWEEN 1 AND 100);

-- An async sale's closed order gives its units back to Redis: all of them.
ALTER TABLE stock_returns
    ADD COLUMN quantity INTEGER NOT NULL DEFAULT 1 CHECK (quantity BETWEEN 1 AND 100);

-- The events keep the order's quantity as they keep its other columns.
ALTER TABLE order_events ADD COLUMN quantity INTEGER NOT NULL DEFAULT 1;

CREATE OR REPLACE FUNCTION order_events_created() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO order_events (type, order_id, sequence, user_id, voucher_id,
                              order_created_at, status, pay_by, paid_at, quantity)
    SELECT 'order.created', n.id, n.events, n.user_id, n.voucher_id,
           n.created_at, n.status, n.pay_by, n.paid_at, n.quantity
    FROM created_orders n
    ORDER BY n.id;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION order_events_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO order_events (type, order_id, sequence, user_id, voucher_id,
                              order_created_at, status, pay_by, paid_at, quantity)
    SELECT 'order.' || n.status, n.id, n.events, n.user_id, n.voucher_id,
           n.created_at, n.status, n.pay_by, n.paid_at, n.quantity
    FROM changed_new n JOIN changed_old o ON o.id = n.id
    WHERE n.status IS DISTINCT FROM o.status AND n.status IN ('paid', 'cancelled', 'expired')
    ORDER BY n.id;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION order_events_refund() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    o voucher_orders%ROWTYPE;
BEGIN
    IF NOT NEW.refund THEN
        RETURN NULL;
    END IF;
    UPDATE voucher_orders SET events = events + 1 WHERE id = NEW.order_id RETURNING * INTO o;
    INSERT INTO order_events (type, order_id, sequence, user_id, voucher_id,
                              order_created_at, status, pay_by, paid_at, payment_id,
                              amount_cents, quantity)
    VALUES ('payment.refund_due', o.id, o.events, o.user_id, o.voucher_id,
            o.created_at, o.status, o.pay_by, o.paid_at, NEW.payment_id, NEW.amount_cents,
            o.quantity);
    RETURN NULL;
END $$;
