//! Order events: what changed ([`EventType`]), where in the feed
//! ([`EventId`]), and the order as it stood then ([`OrderEvent`]).

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};

use super::Order;

/// What changed. Its word is the event's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Created,
    Paid,
    Cancelled,
    Expired,
    RefundDue,
}

impl EventType {
    pub const ALL: &'static [Self] = &[
        Self::Created,
        Self::Paid,
        Self::Cancelled,
        Self::Expired,
        Self::RefundDue,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Created => "order.created",
            Self::Paid => "order.paid",
            Self::Cancelled => "order.cancelled",
            Self::Expired => "order.expired",
            Self::RefundDue => "payment.refund_due",
        }
    }
}

impl FromStr for EventType {
    type Err = super::UnknownState;

    fn from_str(word: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| t.as_str() == word)
            .ok_or_else(|| super::UnknownState::new("event type", word))
    }
}

/// An event's place in the feed: the transaction that wrote it, then its
/// row. Written as 32 hex digits, so that ids sort as text as they do in
/// the feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EventId {
    pub tx: i64,
    pub row: i64,
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}{:016x}", self.tx, self.row)
    }
}

/// Text that is not an event id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an event id is 32 lowercase hex digits, as the feed gives them")]
pub struct NotAnEventId;

impl FromStr for EventId {
    type Err = NotAnEventId;

    fn from_str(text: &str) -> Result<Self, NotAnEventId> {
        let hex = |part: &str| {
            part.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                .then(|| i64::from_str_radix(part, 16).ok())
                .flatten()
                .filter(|n| *n >= 0)
        };
        if text.len() != 32 || !text.is_ascii() {
            return Err(NotAnEventId);
        }
        match (hex(&text[..16]), hex(&text[16..])) {
            (Some(tx), Some(row)) => Ok(Self { tx, row }),
            _ => Err(NotAnEventId),
        }
    }
}

/// A payment whose money goes back (with `payment.refund_due`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundDue {
    pub payment_id: String,
    pub amount_cents: i64,
}

/// One committed change of an order.
#[derive(Debug, Clone)]
pub struct OrderEvent {
    pub id: EventId,
    pub kind: EventType,
    pub created_at: DateTime<Utc>,
    /// 1 for the order's first event, then 2, 3, ...
    pub sequence: i32,
    /// The order as it stood right after the change.
    pub order: Order,
    pub refund: Option<RefundDue>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_round_trip_and_sort_as_text_as_in_the_feed() {
        let ids = [
            EventId { tx: 1, row: 900 },
            EventId { tx: 2, row: 3 },
            EventId {
                tx: 0x1_0000_0000,
                row: 1,
            },
        ];
        for pair in ids.windows(2) {
            assert!(pair[0] < pair[1]);
            assert!(pair[0].to_string() < pair[1].to_string());
        }
        for id in ids {
            assert_eq!(id.to_string().parse::<EventId>(), Ok(id));
        }
        for bad in [
            "",
            "0",
            "000000000000000g0000000000000001",
            "0000000000000001000000000000000A",
            "+000000000000001000000000000000a",
            "ffffffffffffffff0000000000000001",
        ] {
            assert_eq!(bad.parse::<EventId>(), Err(NotAnEventId), "{bad:?}");
        }
    }

    #[test]
    fn every_event_type_reads_back_from_its_word() {
        for kind in EventType::ALL {
            assert_eq!(kind.as_str().parse::<EventType>().ok(), Some(*kind));
        }
        assert!("order.shipped".parse::<EventType>().is_err());
    }
}
