//! The ids of the sale's things, each its own type, so that a voucher id,
//! a user id and an order id cannot be swapped without a compiler error.
//!
//! An order id is 64 bits: a zero sign bit, 31 bits of seconds since
//! 2022-01-01T00:00:00Z, then 32 bits of a per-day counter (drawn by
//! `id::IdGenerator`).

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use chrono::{DateTime, NaiveTime, Utc};
use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// Always positive: every way to make one ([`new`](Self::new),
        /// `TryFrom<i64>`, serde, a Postgres column) refuses 0 and negative
        /// numbers.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "i64", into = "i64")]
        pub struct $name(i64);

        impl $name {
            /// The id numbered `raw`; `None` unless `raw` is positive.
            pub const fn new(raw: i64) -> Option<Self> {
                if raw > 0 {
                    Some(Self(raw))
                } else {
                    None
                }
            }

            /// The number, for a query or a key.
            pub const fn get(self) -> i64 {
                self.0
            }
        }

        impl TryFrom<i64> for $name {
            type Error = NotAnId;
            fn try_from(raw: i64) -> Result<Self, NotAnId> {
                Self::new(raw).ok_or(NotAnId(raw))
            }
        }

        impl From<$name> for i64 {
            fn from(id: $name) -> i64 {
                id.get()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id_type!(
    /// A voucher, as Postgres numbers it.
    VoucherId
);
id_type!(
    /// A buyer, as their signed token names them.
    UserId
);

/// A number that is not a voucher or user id: 0 or negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an id is a positive integer, not {0}")]
pub struct NotAnId(pub i64);

/// 2022-01-01T00:00:00Z in unix seconds: second 0 of every order id.
pub const EPOCH_UNIX: i64 = 1_640_995_200;
/// Bits of the per-day counter.
const SEQUENCE_BITS: u32 = 32;
/// A 64-bit order id. Clients see it as a decimal string: it exceeds 2^53.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OrderId(i64);

impl OrderId {
    /// Builds an id from its parts; `None` when either is out of range.
    pub fn from_parts(seconds_since_epoch: i64, sequence: u64) -> Option<Self> {
        if !(0..1 << 31).contains(&seconds_since_epoch) || sequence > u64::from(u32::MAX) {
            return None;
        }
        Some(Self(seconds_since_epoch << SEQUENCE_BITS | sequence as i64))
    }

    /// An id as the orders table holds it (always positive).
    pub fn from_stored(id: i64) -> Option<Self> {
        (id > 0).then_some(Self(id))
    }

    /// The number, for a query or a key.
    pub const fn get(self) -> i64 {
        self.0
    }

    /// Seconds since 2022-01-01T00:00:00Z when the id was drawn.
    pub fn seconds_since_epoch(self) -> i64 {
        self.0 >> SEQUENCE_BITS
    }

    /// The per-day counter value.
    pub fn sequence(self) -> u32 {
        (self.0 & 0xFFFF_FFFF) as u32
    }

    /// When the id was drawn, by the clock that stamped it.
    pub fn drawn_at(self) -> DateTime<Utc> {
        DateTime::from_timestamp(self.seconds_since_epoch() + EPOCH_UNIX, 0)
            .expect("31 bits of seconds after 2022 are a valid time")
    }
}

/// The ids drawn on the UTC day of `at`: those from its first second up to,
/// not including, the next day's first (`None` outside the id range).
pub fn day_range(at: DateTime<Utc>) -> Option<Range<i64>> {
    let start = day_start(at).timestamp() - EPOCH_UNIX;
    let first = OrderId::from_parts(start, 0)?;
    let next = OrderId::from_parts(start + 86_400, 0).map_or(i64::MAX, OrderId::get);
    Some(first.get()..next)
}

/// The first instant of the UTC day of `at`.
pub fn day_start(at: DateTime<Utc>) -> DateTime<Utc> {
    at.date_naive().and_time(NaiveTime::MIN).and_utc()
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Text that is not an order id: not a positive 64-bit decimal integer
/// written plainly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an order id is a positive 64-bit integer in decimal, without sign or leading zeros")]
pub struct NotAnOrderId;

impl FromStr for OrderId {
    type Err = NotAnOrderId;
    fn from_str(s: &str) -> Result<Self, NotAnOrderId> {
        parse_positive(s).map(Self).ok_or(NotAnOrderId)
    }
}

/// A positive decimal integer written plainly: digits only, no sign, no
/// spaces, no leading zeros (`i64`'s own parser takes `+7` and `007`). The
/// one rule for every id and number that travels in text.
pub fn parse_positive(s: &str) -> Option<i64> {
    if s.is_empty() || s.starts_with('0') || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_positive_only() {
        for bad in [0, -1, -42, i64::MIN] {
            assert_eq!(VoucherId::new(bad), None, "{bad}");
            assert_eq!(UserId::new(bad), None, "{bad}");
            assert_eq!(VoucherId::try_from(bad), Err(NotAnId(bad)));
            assert_eq!(UserId::try_from(bad), Err(NotAnId(bad)));
        }
        for good in [1, 42, i64::MAX] {
            assert_eq!(VoucherId::new(good).map(VoucherId::get), Some(good));
            assert_eq!(UserId::new(good).map(UserId::get), Some(good));
            assert_eq!(UserId::try_from(good).map(i64::from), Ok(good));
        }
    }

    #[test]
    fn ids_in_json_are_plain_positive_numbers() {
        let id = VoucherId::new(7).unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "7");
        assert_eq!(serde_json::from_str::<VoucherId>("7").unwrap(), id);
        for bad in ["0", "-7"] {
            assert!(serde_json::from_str::<VoucherId>(bad).is_err(), "{bad}");
            assert!(serde_json::from_str::<UserId>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parts_round_trip() {
        let id = OrderId::from_parts(123_456, 789).unwrap();
        assert_eq!(id.seconds_since_epoch(), 123_456);
        assert_eq!(id.sequence(), 789);
        assert_eq!(id.get(), (123_456_i64 << 32) | 789);
    }

    #[test]
    fn a_day_range_holds_exactly_that_days_ids() {
        let at = DateTime::from_timestamp(EPOCH_UNIX + 3 * 86_400 + 5_000, 0).unwrap();
        let range = day_range(at).unwrap();
        let first = OrderId::from_parts(3 * 86_400, 0).unwrap().get();
        let last = OrderId::from_parts(4 * 86_400 - 1, u64::from(u32::MAX)).unwrap();
        assert_eq!(range.start, first);
        assert!(range.contains(&last.get()));
        assert!(!range.contains(&(last.get() + 1)));
        assert_eq!(last.drawn_at().timestamp(), EPOCH_UNIX + 4 * 86_400 - 1);
    }

    #[test]
    fn out_of_range_parts_are_refused() {
        assert!(OrderId::from_parts(-1, 1).is_none());
        assert!(OrderId::from_parts(1 << 31, 1).is_none());
        assert!(OrderId::from_parts(1, u64::from(u32::MAX) + 1).is_none());
        assert!(OrderId::from_parts((1 << 31) - 1, u64::from(u32::MAX)).is_some());
    }

    #[test]
    fn numbers_in_text_are_positive_plain_decimals() {
        assert_eq!(parse_positive("7"), Some(7));
        for bad in [
            "",
            "0",
            "07",
            "-7",
            "+7",
            " 7",
            "7 ",
            "1e3",
            "9223372036854775808",
        ] {
            assert_eq!(parse_positive(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn parsing_takes_digits_only() {
        assert_eq!("42".parse::<OrderId>(), Ok(OrderId(42)));
        for bad in [
            "",
            "+42",
            "-42",
            "0",
            "042",
            "4 2",
            "0x2a",
            "99999999999999999999",
            "1e3",
        ] {
            assert!(bad.parse::<OrderId>().is_err(), "{bad:?} parsed");
        }
    }
}
