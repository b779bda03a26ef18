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
-- /orders/{id}). One index, the feed's own key: the sale pays for one
-- more row and one index entry per order, no more.
CREATE TABLE order_events (
    id               BIGSERIAL   NOT NULL,
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
    PRIMARY KEY (tx, id)
);

-- The webhooks read the same feed, from a cursor: everything up to it was
-- acknowledged. One row; the instance holding its lease is the one that
-- sends (another takes over when the lease runs out: a sender killed
-- mid-delivery leaves its batch to be sent again). After a failed
-- delivery, nobody sends before next_attempt_at; failures and
-- first_failure_at say how long the head of the feed has been failing.
CREATE TABLE webhook_cursor (
    singleton        BOOLEAN     PRIMARY KEY DEFAULT true CHECK (singleton),
    after_tx         xid8        NOT NULL DEFAULT '0',
    after_id         BIGINT      NOT NULL DEFAULT 0,
    holder           UUID,
    lease_until      TIMESTAMPTZ NOT NULL DEFAULT 'epoch',
    next_attempt_at  TIMESTAMPTZ NOT NULL DEFAULT 'epoch',
    failures         INTEGER     NOT NULL DEFAULT 0,
    first_failure_at TIMESTAMPTZ,
    last_error       TEXT
);
INSERT INTO webhook_cursor DEFAULT VALUES;

-- Events whose delivery failed after its retry period (the cursor moved
-- past them), and the later events of their orders, held back so that an
-- order's events are never delivered out of order. `retry`: put back by
-- POST /admin/webhooks/retry, sent before the feed, oldest first.
CREATE TABLE webhook_failed (
    tx         xid8        NOT NULL,
    id         BIGINT      NOT NULL,
    order_id   BIGINT      NOT NULL,
    failed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    retry      BOOLEAN     NOT NULL DEFAULT false,
    last_error TEXT,
    PRIMARY KEY (tx, id)
);
CREATE INDEX webhook_failed_order ON webhook_failed (order_id);

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
