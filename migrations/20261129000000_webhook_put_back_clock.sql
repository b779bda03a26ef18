-- Events put back by POST /admin/webhooks/retry are retried on a clock of
-- their own: failures in a row, the first of them, and when the next
-- attempt is due, apart from the feed's failing batch. Put back, they go
-- out at once with a retry period of their own; acknowledging them does
-- not clear the feed's failures (nor theirs the feed's).
ALTER TABLE webhook_cursor
    ADD COLUMN retry_failures         INTEGER     NOT NULL DEFAULT 0,
    ADD COLUMN retry_first_failure_at TIMESTAMPTZ,
    ADD COLUMN retry_next_attempt_at  TIMESTAMPTZ NOT NULL DEFAULT 'epoch';

-- The events put back, looked for at every step of the lease's holder:
-- without it, a scan of every failed event each time.
CREATE INDEX webhook_failed_put_back ON webhook_failed (tx, id) WHERE retry;
