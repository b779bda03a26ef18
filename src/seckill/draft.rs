//! A voucher as an admin asked for it, parsed once into what the store
//! keeps: every field in the range its column holds, or the `bad_request`
//! that names the field (parse, don't validate).

use std::fmt::Display;
use std::ops::RangeInclusive;

use chrono::{DateTime, Utc};

use super::error::{Result, SeckillError};
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

/// A voucher to create, as an admin sent it.
#[derive(Debug, Clone)]
pub struct VoucherDraft {
    pub title: String,
    pub stock: i64,
    pub begin_time: DateTime<Utc>,
    pub end_time: DateTime<Utc>,
    pub sale_mode: SaleMode,
    pub price_cents: i64,
    pub pay_within_seconds: i64,
    pub max_orders_per_user: i64,
    /// Most units one order may take (1 to [`Quantity::MAX`]).
    pub max_units_per_user: i64,
    /// The waiting room's pace; `None`: no room.
    pub admit_per_second: Option<i64>,
    /// Proof of work a join of the room asks for, in zero bits (0: none).
    pub queue_proof_bits: i64,
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
            .admit_per_second
            .map(|rate| within("waiting_room.admit_per_second", rate, ADMIT_PER_SECOND))
            .transpose()?;
        let queue_proof_bits = within(
            "waiting_room.proof_of_work_bits",
            self.queue_proof_bits,
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
}
