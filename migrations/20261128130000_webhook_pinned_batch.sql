-- The batch that failed is the batch retried: the last event of the first
-- batch that failed at the head of the feed, kept until that batch is
-- acknowledged or failed. Retries read the feed up to it and no further,
-- so an event that commits while the head is failing is not swept into
-- the failing batch and failed with it before its own retry period has
-- run; it waits for the next batch, whose period starts at its own first
-- failure.
ALTER TABLE webhook_cursor
    ADD COLUMN failing_upto_tx xid8,
    ADD COLUMN failing_upto_id BIGINT;
