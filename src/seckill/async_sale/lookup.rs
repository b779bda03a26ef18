//! The lookup of a pending async order by its id: who bought how many
//! units of which voucher and when Redis accepted it, kept in Redis until the writer has stored
//! the order. `lua/async_purchase.lua` writes the same form on a single
//! Redis; [`PendingLookup::encode`] and [`PendingLookup::decode`] are its
//! only other writer and its only reader.

use chrono::{DateTime, Utc};

use crate::domain::{parse_positive, Order, OrderId, OrderStatus, Quantity, UserId, VoucherId};

/// A pending order's voucher, user, acceptance time (Redis's clock) and
/// units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PendingLookup {
    voucher_id: VoucherId,
    user_id: UserId,
    accepted_ms: i64,
    quantity: Quantity,
}

impl PendingLookup {
    pub(super) fn new(
        voucher_id: VoucherId,
        user_id: UserId,
        accepted_ms: i64,
        quantity: Quantity,
    ) -> Self {
        Self {
            voucher_id,
            user_id,
            accepted_ms,
            quantity,
        }
    }

    /// `<voucher>:<user>:<accepted_ms>:<units>`, as the purchase script
    /// writes it.
    pub(super) fn encode(&self) -> String {
        format!(
            "{}:{}:{}:{}",
            self.voucher_id, self.user_id, self.accepted_ms, self.quantity
        )
    }

    /// The lookup `encode` (or the script) wrote, or one written before
    /// orders had units (no fourth part: one unit); `None` for anything
    /// else.
    pub(super) fn decode(text: &str) -> Option<Self> {
        let mut parts = text.split(':').map(parse_positive);
        let (Some(Some(v)), Some(Some(u)), Some(Some(ms))) =
            (parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let quantity = match (parts.next(), parts.next()) {
            (None, None) => Quantity::ONE,
            (Some(Some(units)), None) => Quantity::within(units, Quantity::MAX)?,
            _ => return None,
        };
        Some(Self::new(VoucherId::new(v)?, UserId::new(u)?, ms, quantity))
    }

    /// The order it stands for, as `GET /orders/{id}` shows it.
    pub(super) fn order(&self, id: OrderId) -> Order {
        Order {
            id,
            user_id: self.user_id,
            voucher_id: self.voucher_id,
            quantity: self.quantity.get(),
            created_at: DateTime::from_timestamp_millis(self.accepted_ms).unwrap_or_else(Utc::now),
            status: OrderStatus::Pending,
            pay_by: None,
            paid_at: None,
            user_ref: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_reads_back_what_was_written_and_nothing_else() {
        let lookup = PendingLookup::new(
            VoucherId::new(7).unwrap(),
            UserId::new(9).unwrap(),
            1_700_000_000_123,
            Quantity::within(3, 3).unwrap(),
        );
        assert_eq!(lookup.encode(), "7:9:1700000000123:3");
        assert_eq!(PendingLookup::decode(&lookup.encode()), Some(lookup));
        // Written before orders had units: one.
        let older = PendingLookup::decode("7:9:1700000000123").unwrap();
        assert_eq!(older.quantity, Quantity::ONE);
        for bad in [
            "",
            "7:9",
            "7:9:x",
            "7:-9:1",
            "7:9:1:0",
            "7:9:1:101",
            "7:9:1:2:1",
            "7::1",
        ] {
            assert_eq!(PendingLookup::decode(bad), None, "{bad:?}");
        }
    }
}
