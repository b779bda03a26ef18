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

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use redis::Script;
use tokio::sync::oneshot;

use crate::domain::{day_start, OrderId, EPOCH_UNIX};
use crate::kv::{Keys, Kv, KvError};

const DAY_KEY_TTL_SECS: u64 = 3 * 86_400;

#[derive(Debug, thiserror::Error)]
pub enum IdError {
    #[error("the order id counter failed")]
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
