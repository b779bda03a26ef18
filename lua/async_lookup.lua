-- The lookup of one pending async order by its id, on a Redis Cluster,
-- where it lives in another slot than the sale's keys and the purchase
-- script cannot write it (on a single Redis, `async_purchase.lua` does,
-- for all the purchases of its call at once). The hash and its life are
-- set together, so that no hash is ever left without one.
--
-- KEYS[1]  the lookup hash of the hour (and shard) the order id was drawn in
-- ARGV[1]  the order id
-- ARGV[2]  "<voucher>:<user>:<accepted_ms>"
-- ARGV[3]  the hash's life in seconds after this write
redis.call('hset', KEYS[1], ARGV[1], ARGV[2])
return redis.call('expire', KEYS[1], ARGV[3])
