//! Order ids: 64-bit, sortable, unique across instances.
//!
//! Layout: a zero sign bit, 31 bits of seconds since 2022-01-01T00:00:00Z,
//! then 32 bits from a per-day Redis counter `INCR icr:order:{yyyy:MM:dd}`.
//! The seconds come from Redis's clock in the same script as the `INCR`, so
//! instances with skewed clocks still hand out ids that grow in the order
//! Redis served them. A counter past 2^32 - 1 is an error, never a wrap.
//! A counter that Redis lost (a restart without persistence, a failover)
//! is raised past the ids already used with [`IdGenerator::raise_day`].
//!
//! [`IdGenerator::next_id`] batches naturally, as group commit does: the
//! callers that arrive while a draw is in flight share the next one
//! (`INCRBY n`), so a crowd costs one round trip per draw, not per id.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, NaiveTime, Utc};
use redis::Script;
use tokio::sync::oneshot;

use crate::kv::{Keys, Kv, KvError};

/// 2022-01-01T00:00:00Z in unix seconds: second 0 of every order id.
pub const EPOCH_UNIX: i64 = 1_640_995_200;
/// Bits of the per-day counter.
pub const SEQUENCE_BITS: u32 = 32;
const DAY_KEY_TTL_SECS: u64 = 3 * 86_400;

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

    pub fn as_i64(self) -> i64 {
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
pub fn day_range(at: DateTime<Utc>) -> Option<std::ops::Range<i64>> {
    let start = day_start(at).timestamp() - EPOCH_UNIX;
    let first = OrderId::from_parts(start, 0)?;
    let next = OrderId::from_parts(start + 86_400, 0).map_or(i64::MAX, OrderId::as_i64);
    Some(first.as_i64()..next)
}

fn day_start(at: DateTime<Utc>) -> DateTime<Utc> {
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

#[derive(Debug, thiserror::Error)]
pub enum IdError {
    #[error("the id counter: {0}")]
    Redis(#[from] KvError),
    #[error("the order id counter for {day} is exhausted (more than 2^32 - 1 ids today)")]
    Exhausted { day: String },
    #[error("Redis's clock ({unix}) is outside the order id range")]
    ClockOutOfRange { unix: i64 },
    #[error("Redis's clock kept crossing midnight while drawing an id")]
    DayUnsettled,
}

/// Draws order ids from Redis. Cheap to clone; clones share their
/// waiting callers.
#[derive(Clone)]
pub struct IdGenerator {
    redis: Kv,
    keys: Keys,
    script: Script,
    raise: Script,
    queue: Arc<Mutex<Queue>>,
}

/// Callers of [`IdGenerator::next_id`] waiting for the next draw. `None`
/// tells a caller that the shared draw failed.
#[derive(Default)]
struct Queue {
    waiting: Vec<oneshot::Sender<Option<OrderId>>>,
    /// A draw is in flight: new callers wait for the one after it.
    drawing: bool,
}

impl IdGenerator {
    /// A generator whose counter keys start with `prefix` (may be empty).
    pub fn new(redis: Kv, prefix: impl Into<String>) -> Self {
        Self {
            redis,
            keys: Keys::new(prefix),
            script: Script::new(include_str!("../lua/order_id.lua")),
            raise: Script::new(include_str!("../lua/order_id_raise.lua")),
            queue: Arc::default(),
        }
    }

    /// The counter key for the UTC day of `at`.
    pub fn day_key(&self, at: DateTime<Utc>) -> String {
        self.keys.order_counter(at)
    }

    /// The next order id, drawn together with those of the callers that
    /// wait beside this one. If the shared draw fails, this caller draws
    /// alone and hears its own answer.
    pub async fn next_id(&self) -> Result<OrderId, IdError> {
        let (reply, answer) = oneshot::channel();
        let lead = {
            let mut queue = self.queue.lock().expect("id queue lock");
            queue.waiting.push(reply);
            !std::mem::replace(&mut queue.drawing, true)
        };
        if lead {
            // Its own task: a caller that gives up must not strand the
            // others (every draw is bounded by the Redis deadline).
            tokio::spawn(self.clone().draw_for_waiting());
        }
        match answer.await {
            Ok(Some(id)) => Ok(id),
            _ => Ok(self.next_ids(1).await?[0]),
        }
    }

    /// Draws for everyone waiting, again and again, until nobody is.
    async fn draw_for_waiting(self) {
        loop {
            let waiting: Vec<_> = {
                let mut queue = self.queue.lock().expect("id queue lock");
                if queue.waiting.is_empty() {
                    queue.drawing = false;
                    return;
                }
                std::mem::take(&mut queue.waiting)
            };
            let waiting: Vec<_> = waiting.into_iter().filter(|w| !w.is_closed()).collect();
            let Ok(count) = u32::try_from(waiting.len()) else {
                continue;
            };
            if count == 0 {
                continue;
            }
            match self.next_ids(count).await {
                Ok(ids) => {
                    for (reply, id) in waiting.into_iter().zip(ids) {
                        let _ = reply.send(Some(id));
                    }
                }
                Err(_) => {
                    for reply in waiting {
                        let _ = reply.send(None);
                    }
                }
            }
        }
    }

    /// `count` (at least 1) new order ids from one round trip, increasing,
    /// all stamped with the same second.
    pub async fn next_ids(&self, count: u32) -> Result<Vec<OrderId>, IdError> {
        let count = count.max(1);
        let mut day = Utc::now();
        // The first try names the day from our clock; if Redis's clock is on
        // another day the script counts nothing and tells us its time.
        for _ in 0..3 {
            let key = self.day_key(day);
            let (now, last): (i64, u64) = self
                .redis
                .invoke(
                    self.script
                        .key(&key)
                        .arg(day_start(day).timestamp())
                        .arg(DAY_KEY_TTL_SECS)
                        .arg(count),
                )
                .await?;
            if last == 0 {
                day = DateTime::from_timestamp(now, 0)
                    .ok_or(IdError::ClockOutOfRange { unix: now })?;
                continue;
            }
            if last > u64::from(u32::MAX) {
                return Err(IdError::Exhausted { day: key });
            }
            let first = last + 1 - u64::from(count);
            return (first..=last)
                .map(|sequence| {
                    OrderId::from_parts(now - EPOCH_UNIX, sequence)
                        .ok_or(IdError::ClockOutOfRange { unix: now })
                })
                .collect();
        }
        Err(IdError::DayUnsettled)
    }

    /// Makes the counter of `day` count on from at least `sequence`, the
    /// highest one already used that day: after Redis lost the counter, no
    /// id drawn again repeats one that is taken.
    pub async fn raise_day(&self, day: DateTime<Utc>, sequence: u32) -> Result<(), IdError> {
        let _: u64 = self
            .redis
            .invoke(
                self.raise
                    .key(self.day_key(day))
                    .arg(sequence)
                    .arg(DAY_KEY_TTL_SECS),
            )
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip() {
        let id = OrderId::from_parts(123_456, 789).unwrap();
        assert_eq!(id.seconds_since_epoch(), 123_456);
        assert_eq!(id.sequence(), 789);
        assert_eq!(id.as_i64(), (123_456_i64 << 32) | 789);
    }

    #[test]
    fn a_day_range_holds_exactly_that_days_ids() {
        let at = DateTime::from_timestamp(EPOCH_UNIX + 3 * 86_400 + 5_000, 0).unwrap();
        let range = day_range(at).unwrap();
        let first = OrderId::from_parts(3 * 86_400, 0).unwrap().as_i64();
        let last = OrderId::from_parts(4 * 86_400 - 1, u64::from(u32::MAX)).unwrap();
        assert_eq!(range.start, first);
        assert!(range.contains(&last.as_i64()));
        assert!(!range.contains(&(last.as_i64() + 1)));
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
