//! How a purchase ended: one name for the metric label
//! (`seckill_purchases_total{outcome}`) and the HTTP error code alike.

/// How a purchase ended. Each refusal's [`Outcome::label`] is also the
/// `error` code its answer carries (`http::error` is tested against it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Committed (`200`).
    Ordered,
    /// Accepted by an async sale (`202`).
    Accepted,
    NotFound,
    NotStarted,
    Ended,
    SoldOut,
    NotEnoughStock,
    AlreadyPurchased,
    PurchaseInProgress,
    TooManyOrders,
    NotAdmitted,
    Unavailable,
    /// Anything else: bad input, or a bug.
    Error,
}

impl Outcome {
    /// Every outcome, in the order of [`Outcome::index`].
    pub const ALL: [Outcome; 13] = [
        Self::Ordered,
        Self::Accepted,
        Self::NotFound,
        Self::NotStarted,
        Self::Ended,
        Self::SoldOut,
        Self::NotEnoughStock,
        Self::AlreadyPurchased,
        Self::PurchaseInProgress,
        Self::TooManyOrders,
        Self::NotAdmitted,
        Self::Unavailable,
        Self::Error,
    ];

    /// The metric label, and a refusal's error code.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Ordered => "ordered",
            Self::Accepted => "accepted",
            Self::NotFound => "not_found",
            Self::NotStarted => "not_started",
            Self::Ended => "ended",
            Self::SoldOut => "sold_out",
            Self::NotEnoughStock => "not_enough_stock",
            Self::AlreadyPurchased => "already_purchased",
            Self::PurchaseInProgress => "purchase_in_progress",
            Self::TooManyOrders => "too_many_orders",
            Self::NotAdmitted => "not_admitted",
            Self::Unavailable => "unavailable",
            Self::Error => "error",
        }
    }

    /// Its place in [`Outcome::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_sits_at_its_index_with_a_label_of_its_own() {
        let mut labels = std::collections::HashSet::new();
        for (i, outcome) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome.index(), i, "{outcome:?}");
            assert!(
                labels.insert(outcome.label()),
                "{outcome:?}'s label repeats"
            );
        }
    }
}
