-- A voucher's waiting room: with one, a purchase needs an admission, and
-- admissions move at admit_per_second across all instances together (the
-- room itself lives in Redis; see src/seckill/room.rs). NULL: no room, a
-- purchase needs nothing more than before.
--
-- queue_proof_bits: joining the room asks for proof of work, a nonce whose
-- SHA-256 with the user's challenge starts with this many zero bits (0:
-- none), so that a bot pays CPU for every identity it queues.
ALTER TABLE seckill_vouchers
    ADD COLUMN admit_per_second INTEGER
        CHECK (admit_per_second BETWEEN 1 AND 100000),
    ADD COLUMN queue_proof_bits SMALLINT NOT NULL DEFAULT 0
        CHECK (queue_proof_bits BETWEEN 0 AND 32);
