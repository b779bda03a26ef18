-- A voucher's waiting room: with one, a purchase needs an admission, and
-- admissions move at admit_per_second across all instances together (the
-- room itself lives in Redis; see src/seckill/room.rs). NULL: no room, a
-- purchase needs nothing more than before.
ALTER TABLE seckill_vouchers
    ADD COLUMN admit_per_second INTEGER
        CHECK (admit_per_second BETWEEN 1 AND 100000);
