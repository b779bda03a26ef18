-- The shop around the engine: its users (JWT subjects) and its order
-- events (a transactional outbox).

-- Users the shop's identity provider names by a `sub` that is not a
-- positive decimal integer (a UUID, an opaque string): each (issuer,
-- subject) gets an id of its own, the same on every instance and after
-- restarts, never shared by two. Numeric subjects are their own user id
-- (below 2^53) and are recorded here too, by a batched background write,
-- only so that orders can show the `sub` they were bought under; mapped
-- ids start at 2^53, above every numeric subject, so the two never meet.
CREATE SEQUENCE user_ref_ids START WITH 9007199254740992 MINVALUE 9007199254740992;
CREATE TABLE user_refs (
    user_id BIGINT PRIMARY KEY CHECK (user_id > 0),
    issuer  TEXT   NOT NULL,
    subject TEXT   NOT NULL CHECK (octet_length(subject) BETWEEN 1 AND 255),
    UNIQUE (issuer, subject)
);

-- How many events an order has had: the `sequence` of its next one.
ALTER TABLE voucher_orders ADD COLUMN events INTEGER NOT NULL DEFAULT 1;

-- Every committed change of an order, written by the triggers below in
-- the transaction that makes the change: an event exists if and only if
-- its change committed, whatever code path made it (the sale's batch, an
-- async writer, a payment, a cancel, the expiry sweep).
--
-- Order of the feed: `tx` is the writing transaction's id. A reader asks
-- for events past its cursor (tx, id) whose tx is below the oldest
-- transaction still running (pg_snapshot_xmin): every transaction below
-- that has ended, so no event can appear later behind the cursor. A plain
-- serial id would not do: ids are drawn at insert, not at commit, and a
-- reader could pass an id whose transaction commits after it.
--
-- The order body is kept as it stood at the change (the columns of GET
-- /orders/{id}); delivery state is for the webhooks.
CREATE TABLE order_events (
    id               BIGSERIAL   PRIMARY KEY,
    tx               xid8        NOT NULL DEFAULT pg_current_xact_id(),
    type             TEXT        NOT NULL CHECK (type IN ('order.created', 'order.paid',
                         'order.cancelled', 'order.expired', 'payment.refund_due')),
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    order_id         BIGINT      NOT NULL,
    sequence         INTEGER     NOT NULL CHECK (sequence >= 1),
    user_id          BIGINT      NOT NULL,
    voucher_id       BIGINT      NOT NULL,
    order_created_at TIMESTAMPTZ NOT NULL,
    status           TEXT        NOT NULL,
    pay_by           TIMESTAMPTZ NOT NULL,
    paid_at          TIMESTAMPTZ,
    payment_id       TEXT,
    amount_cents     BIGINT,
    -- Delivery: due at next_attempt_at (also a claim's lease: a sender that
    -- dies leaves it to come due again); acknowledged at delivered_at;
    -- given up at failed_at, after retries for the configured time.
    next_attempt_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    first_attempt_at TIMESTAMPTZ,
    attempts         INTEGER     NOT NULL DEFAULT 0,
    last_error       TEXT,
    delivered_at     TIMESTAMPTZ,
    failed_at        TIMESTAMPTZ
);
-- The feed, by its cursor.
CREATE INDEX order_events_feed ON order_events (tx, id);
-- What is left to deliver, oldest first (small: an event leaves it when
-- acknowledged).
CREATE INDEX order_events_undelivered ON order_events (id)
    WHERE delivered_at IS NULL;
CREATE INDEX order_events_undelivered_order ON order_events (order_id, sequence)
    WHERE delivered_at IS NULL;
CREATE INDEX order_events_failed ON order_events (id) WHERE failed_at IS NOT NULL;
-- Retention: acknowledged events by age.
CREATE INDEX order_events_created ON order_events (created_at);

-- order.created: one statement-level trigger per INSERT, so a batch of
-- orders costs one more INSERT ... SELECT, not one call per row.
CREATE FUNCTION order_events_created() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO order_events (type, order_id, sequence, user_id, voucher_id,
                              order_created_at, status, pay_by, paid_at)
    SELECT 'order.created', n.id, n.events, n.user_id, n.voucher_id,
           n.created_at, n.status, n.pay_by, n.paid_at
    FROM created_orders n
    ORDER BY n.id;
    RETURN NULL;
END $$;
CREATE TRIGGER order_events_created AFTER INSERT ON voucher_orders
    REFERENCING NEW TABLE AS created_orders
    FOR EACH STATEMENT EXECUTE FUNCTION order_events_created();

-- A change of status counts as the order's next event.
CREATE FUNCTION order_events_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        NEW.events := OLD.events + 1;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER order_events_count BEFORE UPDATE OF status ON voucher_orders
    FOR EACH ROW EXECUTE FUNCTION order_events_count();

-- order.paid, order.cancelled, order.expired: per UPDATE statement, the
-- orders whose status changed.
CREATE FUNCTION order_events_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO order_events (type, order_id, sequence, user_id, voucher_id,
                              order_created_at, status, pay_by, paid_at)
    SELECT 'order.' || n.status, n.id, n.events, n.user_id, n.voucher_id,
           n.created_at, n.status, n.pay_by, n.paid_at
    FROM changed_new n JOIN changed_old o ON o.id = n.id
    WHERE n.status IS DISTINCT FROM o.status AND n.status IN ('paid', 'cancelled', 'expired')
    ORDER BY n.id;
    RETURN NULL;
END $$;
CREATE TRIGGER order_events_changed AFTER UPDATE ON voucher_orders
    REFERENCING OLD TABLE AS changed_old NEW TABLE AS changed_new
    FOR EACH STATEMENT EXECUTE FUNCTION order_events_changed();

-- payment.refund_due: a payment recorded for an order that could not take
-- it (paid already, cancelled, expired). The order's row is held by the
-- payment's transaction already; its event count grows by one.
CREATE FUNCTION order_events_refund() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    o voucher_orders%ROWTYPE;
BEGIN
    IF NOT NEW.refund THEN
        RETURN NULL;
    END IF;
    UPDATE voucher_orders SET events = events + 1 WHERE id = NEW.order_id RETURNING * INTO o;
    INSERT INTO order_events (type, order_id, sequence, user_id, voucher_id,
                              order_created_at, status, pay_by, paid_at, payment_id, amount_cents)
    VALUES ('payment.refund_due', o.id, o.events, o.user_id, o.voucher_id,
            o.created_at, o.status, o.pay_by, o.paid_at, NEW.payment_id, NEW.amount_cents);
    RETURN NULL;
END $$;
CREATE TRIGGER order_events_refund AFTER INSERT ON payments
    FOR EACH ROW EXECUTE FUNCTION order_events_refund();
