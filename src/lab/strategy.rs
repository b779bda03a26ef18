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
}

impl Strategy {
    pub const ALL: [Self; 8] = [
        Self::Naive,
        Self::Version,
        Self::StockGtZero,
        Self::ProcessMutex,
        Self::Setnx,
        Self::SetnxOwner,
        Self::Reentrant,
        Self::Fenced,
    ];

    /// The name in routes and tables.
    pub fn name(self) -> &'static str {
        match self {
            Self::Naive => "naive",
            Self::Version => "version",
            Self::StockGtZero => "stock_gt_zero",
            Self::ProcessMutex => "process_mutex",
            Self::Setnx => "setnx",
            Self::SetnxOwner => "setnx_owner",
            Self::Reentrant => "reentrant",
            Self::Fenced => "fenced",
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
    /// `setnx_owner`, between its `GET` and its delete): the pause that
    /// lets a release land on someone else's lock.
    Release,
}

impl StallAt {
    pub fn name(self) -> &'static str {
        match self {
            Self::Sale => "sale",
            Self::Release => "release",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Sale, Self::Release]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for strategy in Strategy::ALL {
            assert_eq!(Strategy::from_name(strategy.name()), Some(strategy));
        }
        for at in [StallAt::Sale, StallAt::Release] {
            assert_eq!(StallAt::from_name(at.name()), Some(at));
        }
        assert_eq!(Strategy::from_name("Naive"), None);
        assert_eq!(StallAt::from_name(""), None);
    }
}
