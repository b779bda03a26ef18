//! A voucher as an admin asked for it (the body of `POST /admin/vouchers`,
//! its times in strict RFC 3339), parsed once into what the store keeps:
//! every field in the range its column holds, or the `bad_request` that
//! names the field (parse, don't validate).

use std::fmt::Display;
use std::ops::RangeInclusive;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

use super::error::{Result, SeckillError};
use super::{DEFAULT_MAX_ORDERS_PER_USER, DEFAULT_MAX_UNITS_PER_USER, DEFAULT_PAY_WITHIN_SECONDS};
use crate::domain::{NewVoucher, Quantity, SaleMode, VoucherTerms};

const TITLE_MAX_CHARS: usize = 200;
/// Highest price: the largest integer a JSON number carries exactly.
pub const MAX_PRICE_CENTS: i64 = (1 << 53) - 1;
/// Payment windows: a second to a day.
const PAY_WITHIN_SECONDS: RangeInclusive<i32> = 1..=86_400;
/// `max_orders_per_user`.
const ORDERS_PER_USER: RangeInclusive<i32> = 1..=1000;
/// A waiting room's pace.
const ADMIT_PER_SECOND: RangeInclusive<i32> = 1..=100_000;
/// Zero bits of proof of work a room may ask for (2^32 hashes: about an
/// hour of one core).
const PROOF_BITS: RangeInclusive<i16> = 0..=32;

/// A flash sale to create, as an admin sent it (its schema in
/// `/openapi.json`: `CreateVoucher`).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CreateVoucher)]
pub struct VoucherDraft {
    /// 1 to 200 characters, no control characters.
    #[schema(min_length = 1, max_length = 200, example = "Half-price coffee")]
    pub title: String,
    /// Units on sale.
    #[schema(minimum = 0, maximum = 2147483647, example = 100)]
    pub stock: i64,
    /// Strict RFC 3339, years 0000 to 9999 in UTC.
    #[serde(deserialize_with = "rfc3339")]
    #[schema(value_type = String, format = DateTime, example = "2030-05-01T10:00:00Z")]
    pub begin_time: DateTime<Utc>,
    /// After `begin_time`, to the microsecond.
    #[serde(deserialize_with = "rfc3339")]
    #[schema(value_type = String, format = DateTime, example = "2030-05-01T11:00:00Z")]
    pub end_time: DateTime<Utc>,
    /// `sync` (the default): the order is committed to Postgres before
    /// the answer (200); `async`: Redis accepts it (202, `pending`) and the
    /// stream writers commit it.
    #[serde(default)]
    pub sale_mode: SaleMode,
    /// What one unit costs (default 0); a payment must bring exactly this
    /// times the order's quantity.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 9007199254740991.0, example = 990)]
    pub price_cents: i64,
    /// How long a buyer has to pay, from the order's creation (default
    /// 900); an unpaid order then expires and its unit goes back on sale.
    #[serde(default = "default_pay_within")]
    #[schema(minimum = 1, maximum = 86400, example = 900)]
    pub pay_within_seconds: i64,
    /// Most orders one user may have of this voucher, live, cancelled and
    /// expired together (default 3): past it a purchase is
    /// `too_many_orders`, so nobody holds a unit away by buying and
    /// cancelling again and again.
    #[serde(default = "default_max_orders")]
    #[schema(minimum = 1, maximum = 1000, example = 3)]
    pub max_orders_per_user: i64,
    /// Most units one order may take ("limit N per customer"; default 1).
    /// Still one live order per user, so also the most units a user holds.
    #[serde(default = "default_max_units")]
    #[schema(minimum = 1, maximum = 100, example = 1)]
    pub max_units_per_user: i64,
    /// A waiting room in front of the sale: a purchase then needs an
    /// admitted `X-Queue-Ticket` (absent: no room).
    #[serde(default)]
    pub waiting_room: Option<WaitingRoom>,
}

/// A voucher's waiting room.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitingRoom {
    /// Places admitted per second, across all instances together.
    #[schema(minimum = 1, maximum = 100000, example = 50)]
    pub admit_per_second: i64,
    /// Proof of work a join asks for: zero bits of SHA-256 (0, the
    /// default: none). See `X-Queue-Proof`.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 32, example = 0)]
    pub proof_of_work_bits: i64,
}

fn default_pay_within() -> i64 {
    DEFAULT_PAY_WITHIN_SECONDS
}

fn default_max_orders() -> i64 {
    DEFAULT_MAX_ORDERS_PER_USER
}

fn default_max_units() -> i64 {
    DEFAULT_MAX_UNITS_PER_USER
}

/// A voucher's stock as asked for, in the range its column holds.
pub fn stock_units(stock: i64) -> Result<i32> {
    within("stock", stock, 0..=i32::MAX)
}

/// `value` as a `T` in `range`, or the error that names `field`.
fn within<T>(field: &str, value: i64, range: RangeInclusive<T>) -> Result<T>
where
    T: TryFrom<i64> + PartialOrd + Display,
{
    T::try_from(value)
        .ok()
        .filter(|v| range.contains(v))
        .ok_or_else(|| {
            SeckillError::Invalid(format!(
                "{field} must be between {} and {}",
                range.start(),
                range.end()
            ))
        })
}

impl VoucherDraft {
    /// The voucher to store, or why not.
    pub(super) fn parse(self) -> Result<NewVoucher> {
        // Lengths and characters are checked on the title as sent (the
        // schema's limits), and then it is stored trimmed: a title of
        // spaces only is empty.
        let title = self.title.trim();
        if title.is_empty() || self.title.chars().count() > TITLE_MAX_CHARS {
            return Err(SeckillError::Invalid(format!(
                "title must have 1 to {TITLE_MAX_CHARS} characters"
            )));
        }
        if self.title.chars().any(char::is_control) {
            return Err(SeckillError::Invalid(
                "title must not hold control characters".into(),
            ));
        }
        let admit_per_second = self
            .waiting_room
            .as_ref()
            .map(|room| {
                within(
                    "waiting_room.admit_per_second",
                    room.admit_per_second,
                    ADMIT_PER_SECOND,
                )
            })
            .transpose()?;
        let queue_proof_bits = within(
            "waiting_room.proof_of_work_bits",
            self.waiting_room
                .as_ref()
                .map_or(0, |room| room.proof_of_work_bits),
            PROOF_BITS,
        )?;
        if queue_proof_bits > 0 && admit_per_second.is_none() {
            return Err(SeckillError::Invalid(
                "proof of work is asked by a waiting room: give admit_per_second too".into(),
            ));
        }
        let begin_time = storable_time("begin_time", self.begin_time)?;
        let end_time = storable_time("end_time", self.end_time)?;
        if end_time <= begin_time {
            return Err(SeckillError::Invalid(
                "end_time must be after begin_time (to the microsecond)".into(),
            ));
        }
        let stock = stock_units(self.stock)?;
        let terms = VoucherTerms {
            title: title.to_owned(),
            begin_time,
            end_time,
            sale_mode: self.sale_mode,
            price_cents: within("price_cents", self.price_cents, 0..=MAX_PRICE_CENTS)?,
            pay_within_seconds: within(
                "pay_within_seconds",
                self.pay_within_seconds,
                PAY_WITHIN_SECONDS,
            )?,
            max_orders_per_user: within(
                "max_orders_per_user",
                self.max_orders_per_user,
                ORDERS_PER_USER,
            )?,
            max_units_per_user: within(
                "max_units_per_user",
                self.max_units_per_user,
                1..=Quantity::MAX,
            )?,
            admit_per_second,
            queue_proof_bits,
        };
        Ok(NewVoucher { terms, stock })
    }
}

/// A time in strict RFC 3339 (`2026-05-01T10:00:00Z`,
/// `2026-05-01T10:00:00.5+05:30`): `T` between date and time, seconds, a
/// `Z` or `±hh:mm` offset, four-digit years, nothing around it. chrono's own
/// parser is kinder (a space for `T`, `+0530`, surrounding spaces), and what
/// it lets in, another client's parser may not read back.
fn rfc3339<'de, D>(deserializer: D) -> Result<DateTime<Utc>, D::Error>
where
    D: Deserializer<'de>,
{
    let text = String::deserialize(deserializer)?;
    parse_rfc3339(&text).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "{:?} is not an RFC 3339 time such as 2026-05-01T10:00:00Z",
            text.chars().take(40).collect::<String>()
        ))
    })
}

fn parse_rfc3339(text: &str) -> Option<DateTime<Utc>> {
    let b = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| {
        b.get(range.clone())
            .is_some_and(|s| s.iter().all(u8::is_ascii_digit))
    };
    // yyyy-mm-ddThh:mm:ss
    let shape = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && matches!(b[10], b'T' | b't')
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !shape || &b[17..19] == b"60" {
        // Leap seconds: valid RFC 3339, but no clock here keeps them.
        return None;
    }
    let mut rest = &b[19..];
    if rest.first() == Some(&b'.') {
        let fraction = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if fraction == 0 {
            return None;
        }
        rest = &rest[1 + fraction..];
    }
    let offset_ok = match rest {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => [h1, h2, m1, m2].iter().all(|c| c.is_ascii_digit()),
        _ => false,
    };
    if !offset_ok {
        return None;
    }
    DateTime::parse_from_rfc3339(text).ok().map(|t| t.to_utc())
}

/// A time as Postgres keeps it (to the microsecond, truncated as the
/// driver sends it) and as RFC 3339 can write it back (years 0000 to 9999
/// in UTC); anything else is refused rather than stored changed.
fn storable_time(field: &str, time: DateTime<Utc>) -> Result<DateTime<Utc>> {
    let micros = time.timestamp_micros();
    let stored = DateTime::from_timestamp_micros(micros).unwrap_or(time);
    let first = DateTime::parse_from_rfc3339("0000-01-01T00:00:00Z").map(|t| t.to_utc());
    let last = DateTime::parse_from_rfc3339("9999-12-31T23:59:59.999999Z").map(|t| t.to_utc());
    match (first, last) {
        (Ok(first), Ok(last)) if (first..=last).contains(&stored) => Ok(stored),
        _ => Err(SeckillError::Invalid(format!(
            "{field} must fall between 0000-01-01T00:00:00Z and 9999-12-31T23:59:59Z in UTC"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_kept_to_the_microsecond_and_within_four_digit_years() {
        let t = DateTime::parse_from_rfc3339("2026-01-01T00:00:00.0000009Z")
            .unwrap()
            .to_utc();
        assert_eq!(
            storable_time("t", t).unwrap(),
            DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap()
        );
        let late = DateTime::parse_from_rfc3339("9999-12-31T23:59:59-12:00")
            .unwrap()
            .to_utc();
        assert!(storable_time("t", late).is_err());
    }

    #[test]
    fn a_field_out_of_its_range_is_named() {
        assert_eq!(within("n", 5, 1..=10).unwrap(), 5i32);
        let error = within::<i32>("max_orders_per_user", 0, 1..=1000).unwrap_err();
        assert_eq!(
            error.to_string(),
            "max_orders_per_user must be between 1 and 1000"
        );
        assert!(within::<i16>("bits", 70_000, 0..=32).is_err());
        assert!(stock_units(-1).is_err());
        assert!(stock_units(i64::from(i32::MAX) + 1).is_err());
    }

    #[test]
    fn only_strict_rfc_3339_times_parse() {
        for good in [
            "2026-01-01T00:00:00Z",
            "2026-01-01t00:00:00z",
            "2026-01-01T00:00:00.123456789Z",
            "2026-01-01T05:30:00+05:30",
            "0000-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
        ] {
            assert!(parse_rfc3339(good).is_some(), "{good:?} refused");
        }
        for bad in [
            "2026-01-01 00:00:00Z",
            "2026-01-01T00:00:00+0530",
            " 2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00Z ",
            "+10000-01-01T00:00:00Z",
            "12026-01-01T00:00:00Z",
            "2026-01-01T00:00Z",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00:00.Z",
            "2026-01-01T23:59:60Z",
            "2026-02-30T00:00:00Z",
            "2026-01-01T00:00:00+24:00",
            "",
        ] {
            assert!(parse_rfc3339(bad).is_none(), "{bad:?} accepted");
        }
    }
}
