//! The sale's errors, per operation (a purchase's refusals, an order's,
//! the failures every operation shares), and how the errors of the layers
//! below become them: a dependency that is away or slow is `Unavailable`
//! (503), never a bug.

use crate::domain::OrderId;
use crate::domain::Outcome;
use crate::id::IdError;
use crate::kv::KvError;
use crate::store::StoreError;
use redis_locks::LockError;
use std::sync::Arc;

/// What any operation of the sale can fail with: bad input, nothing
/// there, a dependency away or slow, or a bug. A purchase's refusals are
/// [`Refusal`]s, an order's [`OrderRefusal`]s: each operation's own error
/// ([`PurchaseError`], [`OrderError`]) holds its refusals beside these.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SeckillError {
    #[error("{0}")]
    Invalid(String),
    /// A join of a room that asks for proof of work without a nonce that
    /// solves the user's challenge (a bad request, which says what to solve).
    #[error(
        "this room asks for proof of work: send X-Queue-Proof: <nonce>, where SHA-256 of \"{challenge}<nonce>\" starts with {bits} zero bits"
    )]
    ProofNeeded { challenge: String, bits: u32 },
    #[error("{0} not found")]
    NotFound(&'static str),
    /// A dependency is away or slow (`503`); `source` says how it failed.
    #[error("{dependency} is unavailable")]
    Unavailable {
        dependency: &'static str,
        #[source]
        source: Cause,
    },
    #[error("internal error")]
    Internal(#[source] InternalError),
}

/// Why the sale refused a purchase: the buyer's answer, not a failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the sale has not started yet")]
    NotStarted,
    #[error("the sale is over")]
    Ended,
    #[error("no stock left")]
    SoldOut,
    /// Some units are left, fewer than the purchase asked for: this many.
    #[error("only {stock} {} left, fewer than asked for", if *.stock == 1 { "unit" } else { "units" })]
    NotEnoughStock { stock: i32 },
    /// The user's order, when it is known: a client that lost the answer
    /// of its purchase learns the order from its retry.
    #[error("this user already holds an order for this voucher")]
    AlreadyPurchased { order_id: Option<OrderId> },
    #[error("another purchase of this user is in progress")]
    InProgress,
    /// A purchase of a voucher with a waiting room without an admitted
    /// ticket of this user and voucher.
    #[error("{0}")]
    NotAdmitted(&'static str),
    #[error("this user has ordered this voucher as often as it allows ({0})")]
    TooManyOrders(i32),
}

/// How a purchase ended without an order: refused, or failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PurchaseError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Failed(#[from] SeckillError),
}

/// Why an order could not be paid or cancelled as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderRefusal {
    #[error("the order is paid: it can no longer be cancelled")]
    AlreadyPaid,
    #[error("the order expired unpaid: its unit went back on sale")]
    Expired,
    #[error("the order is accepted and not stored yet; ask again in a moment")]
    Pending,
    #[error("this payment_id was recorded for another order or amount")]
    PaymentConflict,
}

/// How a cancel or a payment ended without changing the order as asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OrderError {
    #[error(transparent)]
    Refused(#[from] OrderRefusal),
    #[error(transparent)]
    Failed(#[from] SeckillError),
}

/// The error behind another, shared by the clones of a [`SeckillError`]
/// (the purchases that waited on one read get one each).
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// A bug or a broken expectation: what went wrong, and the error that
/// showed it when there was one (kept as the source, for the log).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what}")]
pub struct InternalError {
    what: String,
    #[source]
    cause: Option<Cause>,
}

impl SeckillError {
    /// The purchase outcome this error stands for.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::NotFound(_) => Outcome::NotFound,
            Self::Unavailable { .. } => Outcome::Unavailable,
            Self::Invalid(_) | Self::ProofNeeded { .. } | Self::Internal(_) => Outcome::Error,
        }
    }

    /// An internal error with no error behind it.
    pub(crate) fn internal(what: impl Into<String>) -> Self {
        Self::Internal(InternalError {
            what: what.into(),
            cause: None,
        })
    }

    /// An internal error shown by `cause`.
    pub(crate) fn internal_from(
        what: impl Into<String>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Internal(InternalError {
            what: what.into(),
            cause: Some(Arc::new(cause)),
        })
    }

    /// `dependency` is unavailable, as `cause` (an error, or a sentence
    /// where no error says it) shows: `503 unavailable`.
    pub fn unavailable(
        dependency: &'static str,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Unavailable {
            dependency,
            source: Arc::from(cause.into()),
        }
    }

    /// Redis did not answer as the sale needs.
    pub fn redis_unavailable(cause: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::unavailable("Redis", cause)
    }

    pub(super) fn postgres_unavailable(
        cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::unavailable("Postgres", cause)
    }
}

pub type Result<T, E = SeckillError> = std::result::Result<T, E>;

impl Refusal {
    /// The purchase outcome this refusal stands for.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::NotStarted => Outcome::NotStarted,
            Self::Ended => Outcome::Ended,
            Self::SoldOut => Outcome::SoldOut,
            Self::NotEnoughStock { .. } => Outcome::NotEnoughStock,
            Self::AlreadyPurchased { .. } => Outcome::AlreadyPurchased,
            Self::InProgress => Outcome::PurchaseInProgress,
            Self::TooManyOrders(_) => Outcome::TooManyOrders,
            Self::NotAdmitted(_) => Outcome::NotAdmitted,
        }
    }
}

impl PurchaseError {
    /// The purchase outcome this error stands for.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Refused(refusal) => refusal.outcome(),
            Self::Failed(error) => error.outcome(),
        }
    }
}

/// A dependency's error, classified as [`SeckillError`] classifies it,
/// ends a purchase or an order's change as that failure (`?` on a call to
/// the store, Redis, the locks or the ids).
macro_rules! failed_from {
    ($($source:ty),*) => {$(
        impl From<$source> for PurchaseError {
            fn from(error: $source) -> Self {
                Self::Failed(error.into())
            }
        }
        impl From<$source> for OrderError {
            fn from(error: $source) -> Self {
                Self::Failed(error.into())
            }
        }
    )*};
}

failed_from!(StoreError, LockError, KvError, Arc<KvError>, IdError);

impl From<StoreError> for SeckillError {
    fn from(error: StoreError) -> Self {
        match error {
            // A deadlock or serialization failure rolled the work back:
            // the same call may go through a moment later.
            e
            @ (StoreError::Unavailable(_) | StoreError::TimedOut(_) | StoreError::Conflict(_)) => {
                Self::postgres_unavailable(e)
            }
            // Only a sale inserts orders, and it answers its own (the
            // batch's `already bought?`): anywhere else it is a bug.
            e @ StoreError::DuplicateOrder => {
                Self::internal_from("an order the unique index refused", e)
            }
            // The id counter handed out a taken id again and again: Redis
            // keeps losing it, which another moment may not.
            e @ StoreError::DuplicateOrderId => Self::redis_unavailable(e),
            StoreError::OutOfRange(_) => Self::Invalid("the stock would exceed its maximum".into()),
            e @ (StoreError::Other(_) | StoreError::MigrationsDiffer(_)) => {
                Self::internal_from("Postgres", e)
            }
        }
    }
}

impl From<LockError> for SeckillError {
    fn from(error: LockError) -> Self {
        match error {
            LockError::Redis(e) if crate::kv::is_transient(&e) => Self::redis_unavailable(e),
            LockError::Redis(e) => Self::internal_from("Redis, taking a lock", e),
            e @ LockError::NodesUnavailable { .. } => Self::redis_unavailable(e),
            e @ LockError::NotHeld { .. } => Self::internal_from("a lock", e),
        }
    }
}

impl From<KvError> for SeckillError {
    fn from(error: KvError) -> Self {
        if error.is_transient() {
            Self::redis_unavailable(error)
        } else {
            Self::internal_from("Redis", error)
        }
    }
}

/// A Redis error shared by the purchases that waited for one read.
impl From<std::sync::Arc<KvError>> for SeckillError {
    fn from(error: std::sync::Arc<KvError>) -> Self {
        if error.is_transient() {
            Self::redis_unavailable(error)
        } else {
            Self::internal_from("Redis", error)
        }
    }
}

impl From<IdError> for SeckillError {
    fn from(error: IdError) -> Self {
        match error {
            IdError::Redis(e) => e.into(),
            // Redis's clock out of range or unsettled, or a day's ids used
            // up: Redis cannot give an id now; another moment (or another
            // day) can.
            e => Self::redis_unavailable(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_units_left_are_counted_in_words_that_agree() {
        let left = |stock| Refusal::NotEnoughStock { stock }.to_string();
        assert_eq!(left(1), "only 1 unit left, fewer than asked for");
        assert_eq!(left(2), "only 2 units left, fewer than asked for");
    }
}
