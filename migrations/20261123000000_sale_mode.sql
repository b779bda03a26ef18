-- How a voucher is sold, chosen when it is created:
--   'sync'   the order is committed here before the buyer hears 200;
--   'async'  Redis takes the stock and appends the order to the voucher's
--            stream (answer 202, "pending"); a consumer group writes the
--            stream here. Postgres still decides: `stock > 0`, the unique
--            (user, voucher) index and the primary key on the id hold for
--            both modes alike.
ALTER TABLE seckill_vouchers
    ADD COLUMN sale_mode TEXT NOT NULL DEFAULT 'sync' CHECK (sale_mode IN ('sync', 'async'));

-- The async vouchers a writer may still have to drain, found by time.
CREATE INDEX seckill_vouchers_async_end ON seckill_vouchers (end_time) WHERE sale_mode = 'async';
