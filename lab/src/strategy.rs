//! The lab's vocabulary: the strategies by name, and the stalls a request
//! may ask for.

use std::fmt;
use std::time::Duration;

/// One design of the purchase, in the order LAB.md tells them: each fixes
/// the failure of the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Read the stock, check it, decrement unconditionally: oversells.
    Naive,
    /// Compare-and-set on the stock value read: undersells.
    Version,
    /// `stock > 0` in the UPDATE, no guard per user: one user buys twice.
    StockGtZero,
    /// The course's own code: the per-user mutex of `process_mutex`, taken
    /// inside the transaction that checks and sells and given back before
    /// that transaction commits (`synchronized` in a method called from a
    /// `@Transactional` one). The user's next request, waiting for the
    /// mutex, checks before the first order is committed: one user buys
    /// twice on one instance.
    LockBeforeCommit,
    /// A mutex per user in this process: fails with two instances.
    ProcessMutex,
    /// `SET NX PX` and a plain delete: deletes someone else's lock.
    Setnx,
    /// `SET NX PX`, `GET` to check the owner, then a separate delete.
    SetnxOwner,
    /// The service's reentrant lock, released by an owner-checking script.
    Reentrant,
    /// `reentrant` plus a fencing token that Postgres checks.
    Fenced,
    /// No lock outside Postgres: one transaction takes the voucher's row
    /// with `SELECT ... FOR UPDATE`, checks the stock and the user, sells,
    /// commits. Correct anywhere; every buyer of the voucher waits in line.
    ForUpdate,
    /// Stock in Redis: `GET` it, `DECR` it, then insert the order: goes
    /// below zero, and a crash between the two loses the order.
    RedisDecr,
    /// One Lua script checks the stock and the buyer and decrements; the
    /// order is inserted inline after it: a crash in between loses it.
    RedisLua,
    /// The script also appends the order to a stream that a consumer group
    /// writes; a writer that dies mid-batch is recovered by a claim.
    RedisStream,
}

impl Strategy {
    pub const ALL: [Self; 13] = [
        Self::Naive,
        Self::Version,
        Self::StockGtZero,
        Self::LockBeforeCommit,
        Self::ProcessMutex,
        Self::Setnx,
        Self::SetnxOwner,
        Self::Reentrant,
        Self::Fenced,
        Self::ForUpdate,
        Self::RedisDecr,
        Self::RedisLua,
        Self::RedisStream,
    ];

    /// The name in routes and tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Naive => "naive",
            Self::Version => "version",
            Self::StockGtZero => "stock_gt_zero",
            Self::LockBeforeCommit => "lock_before_commit",
            Self::ProcessMutex => "process_mutex",
            Self::Setnx => "setnx",
            Self::SetnxOwner => "setnx_owner",
            Self::Reentrant => "reentrant",
            Self::Fenced => "fenced",
            Self::ForUpdate => "for_update",
            Self::RedisDecr => "redis_decr",
            Self::RedisLua => "redis_lua",
            Self::RedisStream => "redis_stream",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a stalled request pauses, holding whatever guard its strategy took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallAt {
    /// After "already bought?" said no, before the sale: the pause that
    /// lets a second request of the user buy in between.
    Sale,
    /// After the sale, just before the guard is given back (for
    /// `setnx_owner`, between its `GET` and its delete; for
    /// `lock_before_commit`, before it gives its mutex back, inside its
    /// transaction; for `for_update`, whose guard is the row lock, before
    /// the commit): the pause that lets a release land on someone else's
    /// lock.
    Release,
    /// The Redis-stock designs only: the process "dies" right after the
    /// Redis step (the request answers 503 and does nothing more); for
    /// `redis_stream`, the first writer that reads the order dies with its
    /// batch unacknowledged.
    Crash,
}

impl StallAt {
    pub fn name(self) -> &'static str {
        match self {
            Self::Sale => "sale",
            Self::Release => "release",
            Self::Crash => "crash",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Sale, Self::Release, Self::Crash]
            .into_iter()
            .find(|s| s.name() == name)
    }
}

/// A pause a lab request asks for, to make a timing race happen on demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    pub at: StallAt,
    pub duration: Duration,
}

/// One lab purchase as asked for: the design, the buyer, the voucher and
/// the pause to make a race happen.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    pub strategy: Strategy,
    pub user_id: i64,
    pub voucher_id: i64,
    pub stall: Option<Stall>,
}

impl Attempt {
    /// Strategy, user, voucher and stall, to bind in one line.
    pub fn parts(self) -> (Strategy, i64, i64, Option<Stall>) {
        (self.strategy, self.user_id, self.voucher_id, self.stall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for strategy in Strategy::ALL {
            assert_eq!(Strategy::from_name(strategy.name()), Some(strategy));
        }
        for at in [StallAt::Sale, StallAt::Release, StallAt::Crash] {
            assert_eq!(StallAt::from_name(at.name()), Some(at));
        }
        assert_eq!(Strategy::from_name("Naive"), None);
        assert_eq!(StallAt::from_name(""), None);
    }
}
