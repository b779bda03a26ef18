-- Fencing tokens: the last token under which each user's purchase was
-- written. A purchase carries the token of the user's lock it holds; one
-- whose token is smaller than the stored one comes from a holder whose
-- lease ran out while the next holder already wrote, and is refused in the
-- same statement that would have sold the unit (see store::sell_one).
-- Tokens only grow per lock, so the comparison is all it takes.
CREATE TABLE user_fences (
    user_id  BIGINT PRIMARY KEY CHECK (user_id > 0),
    token    BIGINT NOT NULL
);
