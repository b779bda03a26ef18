-- One index of a voucher's orders by user, in place of two. The sale
-- statement counts a user's orders of a voucher (live, cancelled and
-- expired) and finds the live one in a single probe of it, and the
-- voucher's listings and books read its leading column: the index on the
-- voucher alone and the one on (user, voucher) for every status each cost
-- an entry per order and served nothing this one does not. No query looks
-- orders up by user across vouchers. The unique index on live orders
-- (voucher_orders_user_voucher) stays: it enforces one live order per user.
CREATE INDEX voucher_orders_voucher_user ON voucher_orders (voucher_id, user_id);
DROP INDEX voucher_orders_voucher;
DROP INDEX voucher_orders_user_voucher_all;
