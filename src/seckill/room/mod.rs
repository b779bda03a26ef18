//! The waiting room: a fair queue in front of a voucher's sale, admitted at
//! the pace the sale can serve, the same on every instance.
//!
//! The room lives in Redis (`lua/room_join.lua`: the pre-queue, the later
//! joiners, the serving counter, the admissions), one round trip per join
//! or poll. What the client holds is a ticket signed by the service (user,
//! voucher, admitted until, expiry), which a purchase checks locally: no
//! Redis, no Postgres, to tell an admitted buyer from anyone else.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use redis::Script;
use secrecy::ExposeSecret;
use sha2::Sha256;

use super::error::{PurchaseError, Refusal, Result, SeckillError};
use super::metric;
use crate::domain::Voucher;
use crate::domain::{UserId, VoucherId};
use crate::kv::{Keys, Kv};

type HmacSha256 = Hmac<Sha256>;

mod ticket;

pub(super) use ticket::Ticket;
pub use ticket::{challenge, proof_holds, ticket_key, TicketKey};

/// How long an admission lets its user buy, from when Redis's clock first
/// saw the user's place served. A user who asks again after it is placed
/// again at the back of the room.
pub const ADMISSION_WINDOW: Duration = Duration::from_secs(60);
/// The room's keys outlive the sale by this much (late polls find it).
const KEEP_AFTER_END: Duration = Duration::from_secs(86_400);
/// Longest a waiting client is told to wait before its next poll.
const MAX_POLL_EVERY: u64 = 30;
/// A sold-out room is asked again after this long: units may come back.
const SOLD_OUT_POLL_EVERY: u64 = 10;

/// Where a user stands in a room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueStatus {
    Waiting,
    Admitted,
    SoldOut,
}

/// What a joining or polling client is told.
#[derive(Debug, Clone)]
pub struct QueueState {
    /// Signed: user, voucher, admitted until (if admitted), expiry.
    pub ticket: String,
    pub status: QueueStatus,
    /// `None` until placed (the pre-queue is placed at the start).
    pub place: Option<i64>,
    /// Places up to this one are admitted.
    pub serving: i64,
    /// Places handed out so far (0 before the start).
    pub placed: i64,
    /// People ahead of this place still waiting.
    pub ahead: Option<i64>,
    /// Seconds until this place is served, at the room's pace.
    pub estimate_seconds: Option<i64>,
    pub admitted_until: Option<DateTime<Utc>>,
    /// When to poll again.
    pub retry_after_seconds: u64,
}

/// A room's counter as an operator watches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomCounter {
    /// Places up to this one are admitted.
    pub serving: i64,
    /// Places handed out so far (0 before the start).
    pub placed: i64,
    /// Places handed out and not yet admitted.
    pub waiting: i64,
    /// Places admitted per second.
    pub admit_per_second: i32,
}

/// The rooms of this instance's vouchers.
pub(super) struct Rooms {
    redis: Kv,
    keys: Keys,
    join: Script,
    keyed: HmacSha256,
    /// The last count of waiting places seen per voucher, for the gauge.
    waiting: Mutex<HashMap<VoucherId, i64>>,
    /// Each room's counter as last read, at most [`SERVED_REFRESH`] ago:
    /// a poll far from the front, or of an admitted ticket, is answered
    /// from it and its ticket, without a round trip of its own.
    served: moka::future::Cache<VoucherId, Served>,
}

/// How old a room's counter that answers polls may be.
const SERVED_REFRESH: Duration = Duration::from_millis(100);

/// A room's counter, as the script last moved it.
#[derive(Debug, Clone, Copy)]
struct Served {
    serving: i64,
    placed: i64,
    sold_out: bool,
}

impl Rooms {
    pub(super) fn new(redis: Kv, prefix: String, key: &TicketKey) -> Self {
        Self {
            redis,
            keys: Keys::new(prefix),
            join: Script::new(include_str!("../../../lua/room_join.lua")),
            keyed: HmacSha256::new_from_slice(key.expose_secret())
                .expect("HMAC takes any key length"),
            waiting: Mutex::new(HashMap::new()),
            served: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(SERVED_REFRESH)
                .build(),
        }
    }

    /// Joins `user_id` to `voucher`'s room (or finds their place), moving
    /// the serving counter on. `async_sale` is an async sale's stock hash,
    /// which tells the script when it sold out; `sold_out` is what this
    /// instance knows of a sync sale.
    pub(super) async fn join(
        &self,
        voucher: &Voucher,
        rate: i32,
        user_id: UserId,
        sold_out: bool,
        async_sale: Option<String>,
    ) -> Result<QueueState> {
        let placing = self
            .call(voucher, rate, Some(user_id), sold_out, async_sale)
            .await?;
        Ok(self.state(voucher, rate, user_id, placing))
    }

    /// Where the holder of `ticket` stands: from the ticket and the room's
    /// counter as last read (one script call per room and refresh, shared)
    /// while the ticket is admitted or its place is not reached; from the
    /// script otherwise (placing the ticket, or admitting it).
    pub(super) async fn poll(
        &self,
        voucher: &Voucher,
        rate: i32,
        ticket: &Ticket,
        now: DateTime<Utc>,
        sold_out: bool,
        async_sale: Option<String>,
    ) -> Result<QueueState> {
        let now_ms = now.timestamp_millis();
        if now < voucher.terms.begin_time {
            // In the pre-queue since the join: nobody has a place yet.
            let placing = Placing::waiting(-1, 0, now_ms, 0);
            return Ok(self.state(voucher, rate, ticket.user_id, placing));
        }
        let served = self
            .served(voucher, rate, sold_out, async_sale.clone())
            .await?;
        let window = window_ms();
        let placing = if ticket.admitted_until_ms > now_ms {
            Placing {
                place: ticket.place,
                serving: served.serving,
                admitted_ms: ticket.admitted_until_ms - window,
                now_ms,
                placed: served.placed,
                sold_out: served.sold_out,
            }
        } else if ticket.place > served.serving && ticket.place <= served.placed && !served.sold_out
        {
            // Not reached yet. A place past those handed out is one that
            // Redis lost (restarted empty): the script places it again.
            Placing::waiting(ticket.place, served.serving, now_ms, served.placed)
        } else {
            self.call(voucher, rate, Some(ticket.user_id), sold_out, async_sale)
                .await?
        };
        Ok(self.state(voucher, rate, ticket.user_id, placing))
    }

    /// The room's counter: as last read (at most [`SERVED_REFRESH`] ago,
    /// the same read the polls share), else from the script, moving it on.
    async fn counter(
        &self,
        voucher: &Voucher,
        rate: i32,
        now: DateTime<Utc>,
        sold_out: bool,
        async_sale: Option<String>,
    ) -> Result<RoomCounter> {
        if now < voucher.terms.begin_time {
            // The pre-queue is placed at the start: nobody has a place yet.
            return Ok(RoomCounter {
                serving: 0,
                placed: 0,
                waiting: 0,
                admit_per_second: rate,
            });
        }
        let served = self.served(voucher, rate, sold_out, async_sale).await?;
        Ok(RoomCounter {
            serving: served.serving,
            placed: served.placed,
            waiting: (served.placed - served.serving).max(0),
            admit_per_second: rate,
        })
    }

    /// The room's counter as last read (at most [`SERVED_REFRESH`] ago),
    /// else from the script, moving it on: one read per room and refresh,
    /// which every caller in between shares.
    async fn served(
        &self,
        voucher: &Voucher,
        rate: i32,
        sold_out: bool,
        async_sale: Option<String>,
    ) -> Result<Served> {
        self.served
            .try_get_with(voucher.id, async {
                self.call(voucher, rate, None, sold_out, async_sale)
                    .await
                    .map(|p| Served {
                        serving: p.serving,
                        placed: p.placed,
                        sold_out: p.sold_out,
                    })
            })
            .await
            .map_err(|error| (*error).clone())
    }

    /// One run of the room's script for `user_id` (joining them if need
    /// be), or with none, to move the counter on and read it.
    async fn call(
        &self,
        voucher: &Voucher,
        rate: i32,
        user_id: Option<UserId>,
        sold_out: bool,
        async_sale: Option<String>,
    ) -> Result<Placing> {
        let life = (voucher.terms.end_time - Utc::now())
            .to_std()
            .unwrap_or_default()
            .saturating_add(KEEP_AFTER_END);
        let keys = self.keys.room(voucher.id);
        let mut invocation = self.join.prepare_invoke();
        invocation
            .key(&keys.state)
            .key(&keys.pre)
            .key(&keys.late)
            .key(&keys.admitted);
        if let Some(sale) = async_sale {
            invocation.key(sale);
        }
        // A draw no client can predict, made here and kept in Redis, so
        // that every instance reads the same one.
        let draw = rand::random::<u64>() >> 12;
        invocation
            .arg(user_id.map_or_else(String::new, |id| id.to_string()))
            .arg(draw)
            .arg(voucher.terms.begin_time.timestamp_millis())
            .arg(rate)
            .arg(u8::from(sold_out))
            .arg(life.as_secs().max(1))
            .arg(window_ms());
        let answer: Vec<i64> = self.redis.invoke(&invocation).await?;
        let [place, serving, admitted_ms, now_ms, placed, out] = answer[..] else {
            return Err(SeckillError::internal(format!(
                "unexpected answer of the room script: {answer:?}"
            )));
        };
        if admitted_ms != 0 && admitted_ms == now_ms {
            metrics::counter!(metric::QUEUE_ADMITTED).increment(1);
        }
        if place > 0 {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            waiting.insert(voucher.id, (placed - serving).max(0));
            metrics::gauge!(metric::QUEUE_WAITING).set(waiting.values().sum::<i64>() as f64);
        }
        Ok(Placing {
            place,
            serving,
            admitted_ms,
            now_ms,
            placed,
            sold_out: out == 1,
        })
    }

    /// What the client is told, and its ticket.
    fn state(&self, voucher: &Voucher, rate: i32, user_id: UserId, p: Placing) -> QueueState {
        let rate = i64::from(rate.max(1));
        let window = window_ms();
        let admitted_until_ms = (p.admitted_ms > 0).then(|| p.admitted_ms + window);
        let place = (p.place > 0).then_some(p.place);
        let ahead = place.map(|place| (place - p.serving - 1).max(0));
        let status = match admitted_until_ms {
            _ if p.sold_out => QueueStatus::SoldOut,
            Some(_) => QueueStatus::Admitted,
            None => QueueStatus::Waiting,
        };
        let estimate_seconds = match (status, place) {
            (QueueStatus::Waiting, Some(place)) => Some((place - p.serving + rate - 1) / rate),
            _ => None,
        };
        let retry_after_seconds = match (status, estimate_seconds) {
            (QueueStatus::SoldOut, _) => SOLD_OUT_POLL_EVERY,
            (QueueStatus::Admitted, _) => 1,
            // Placed: half the wait, so that polls thin out with distance
            // from the front.
            (QueueStatus::Waiting, Some(estimate)) => u64::try_from(estimate / 2)
                .unwrap_or(0)
                .clamp(1, MAX_POLL_EVERY),
            // In the pre-queue: at the start, spread over two seconds so
            // that the whole room does not poll in the same millisecond.
            (QueueStatus::Waiting, None) => {
                let until = (voucher.terms.begin_time.timestamp_millis() - p.now_ms).max(0) / 1000;
                u64::try_from(until).unwrap_or(0) + 1 + rand::random::<u64>() % 2
            }
        };
        let expires = match admitted_until_ms {
            Some(until) => until / 1000,
            None => voucher.terms.end_time.timestamp(),
        };
        // An admission is signed whatever the status: a ticket admitted
        // while the voucher is sold out still buys, within its window, the
        // units a cancel or an expiry gives back (the body says until when).
        let ticket = self.sign(&Ticket {
            voucher_id: voucher.id,
            user_id,
            place: p.place.max(0),
            admitted_until_ms: admitted_until_ms.unwrap_or(0),
            expires_unix: expires,
        });
        QueueState {
            ticket,
            status,
            place,
            serving: p.serving,
            placed: p.placed,
            ahead,
            estimate_seconds,
            admitted_until: admitted_until_ms.and_then(DateTime::from_timestamp_millis),
            retry_after_seconds,
        }
    }
}

/// [`ADMISSION_WINDOW`] in milliseconds.
fn window_ms() -> i64 {
    i64::try_from(ADMISSION_WINDOW.as_millis()).unwrap_or(i64::MAX)
}

/// The room script's answer.
#[derive(Debug, Clone, Copy)]
struct Placing {
    place: i64,
    serving: i64,
    admitted_ms: i64,
    now_ms: i64,
    placed: i64,
    sold_out: bool,
}

impl Placing {
    /// Waiting at `place` (-1: not placed yet).
    fn waiting(place: i64, serving: i64, now_ms: i64, placed: i64) -> Self {
        Self {
            place,
            serving,
            admitted_ms: 0,
            now_ms,
            placed,
            sold_out: false,
        }
    }
}

impl super::Seckill {
    /// Joins `user` to the waiting room of `voucher`, or tells them
    /// their place if they are in it already: one place per user, however
    /// many requests. A room that asks for proof of work needs `proof`, a
    /// nonce that solves the user's challenge (see [`proof_holds`]).
    pub async fn join_queue(
        &self,
        user_id: UserId,
        voucher_id: VoucherId,
        proof: Option<&str>,
    ) -> Result<QueueState, PurchaseError> {
        metrics::counter!(metric::QUEUE_REQUESTS, "kind" => metric::JOIN).increment(1);
        let (voucher, rate) = self.room_of(voucher_id).await?;
        let bits = u32::try_from(voucher.terms.queue_proof_bits).unwrap_or(0);
        if bits > 0 && !proof.is_some_and(|nonce| proof_holds(voucher_id, user_id, nonce, bits)) {
            return Err(SeckillError::ProofNeeded {
                challenge: challenge(voucher_id, user_id),
                bits,
            }
            .into());
        }
        let (sold_out, async_sale) = self.sale_state(&voucher).await?;
        Ok(self
            .inner
            .rooms
            .join(&voucher, rate, user_id, sold_out, async_sale)
            .await?)
    }

    /// Where the holder of `ticket` (their own, for this voucher) stands.
    pub async fn poll_queue(
        &self,
        user_id: UserId,
        voucher_id: VoucherId,
        ticket: &str,
    ) -> Result<QueueState, PurchaseError> {
        metrics::counter!(metric::QUEUE_REQUESTS, "kind" => metric::POLL).increment(1);
        // The room first: a voucher without one is 404 whatever the ticket.
        let (voucher, rate) = self.room_of(voucher_id).await?;
        let ticket = self.inner.rooms.check_own(voucher_id, user_id, ticket)?;
        let (sold_out, async_sale) = self.sale_state(&voucher).await?;
        let now = self.inner.clock.now();
        // Where the script is asked, a poll joins too: a Redis that lost
        // the room places the ticket's holder again rather than forget them.
        Ok(self
            .inner
            .rooms
            .poll(&voucher, rate, &ticket, now, sold_out, async_sale)
            .await?)
    }

    /// `voucher_id`'s waiting room counter (`None`: it has no room): one
    /// Redis round trip at most per room and refresh, shared with the polls.
    pub async fn room_counter(&self, voucher_id: VoucherId) -> Result<Option<RoomCounter>> {
        let voucher = self.selling(voucher_id).await?;
        let Some(rate) = voucher.terms.admit_per_second else {
            return Ok(None);
        };
        let (sold_out, async_sale) = self.sale_state(&voucher).await?;
        let now = self.inner.clock.now();
        self.inner
            .rooms
            .counter(&voucher, rate, now, sold_out, async_sale)
            .await
            .map(Some)
    }

    /// A voucher with a room, and the room's pace; `ended` once its sale
    /// is over (a join then would hold a place, and keys, for nothing).
    async fn room_of(&self, voucher_id: VoucherId) -> Result<(Arc<Voucher>, i32), PurchaseError> {
        let voucher = self.selling(voucher_id).await?;
        let Some(rate) = voucher.terms.admit_per_second else {
            return Err(SeckillError::NotFound("waiting room").into());
        };
        if self.inner.clock.now() >= voucher.terms.end_time {
            return Err(Refusal::Ended.into());
        }
        Ok((voucher, rate))
    }

    /// Whether this instance knows a sync sale sold out, and an async
    /// sale's stock hash, which tells the room's script.
    async fn sale_state(&self, voucher: &Voucher) -> Result<(bool, Option<String>)> {
        Ok(match voucher.terms.sale_mode {
            crate::domain::SaleMode::Sync => (self.inner.flags.is_sold_out(voucher).await?, None),
            crate::domain::SaleMode::Async => {
                (false, Some(self.inner.async_sales.sale_key(voucher.id)))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ticket::leading_zero_bits;
    use super::*;

    fn rooms() -> Rooms {
        let kv = Kv::new(
            redis::Client::open("redis://127.0.0.1:1").unwrap(),
            Duration::from_secs(1),
        );
        Rooms::new(
            kv,
            String::new(),
            &ticket_key(b"a key for the tests of the room"),
        )
    }

    #[test]
    fn a_proof_holds_with_enough_zero_bits_for_its_own_user_and_voucher() {
        assert_eq!(leading_zero_bits(&[0, 0, 0x1f, 0xff]), 19);
        assert_eq!(leading_zero_bits(&[0x80]), 0);
        let holds = |v, u, nonce: &str, bits| {
            proof_holds(
                VoucherId::new(v).unwrap(),
                UserId::new(u).unwrap(),
                nonce,
                bits,
            )
        };
        let bits = 12;
        let nonce = (0u64..)
            .map(|n| n.to_string())
            .find(|n| holds(5, 9, n, bits))
            .unwrap();
        assert!(holds(5, 9, &nonce, bits));
        // The same nonce for another user or voucher: another hash, which
        // has 12 zero bits once in 4,096.
        let others = [(5, 10), (6, 9), (5, 11), (7, 9)];
        assert!(
            others
                .iter()
                .filter(|(v, u)| holds(*v, *u, &nonce, bits))
                .count()
                < 2
        );
        assert!(!holds(5, 9, "", 0));
        assert!(!holds(5, 9, &"1".repeat(65), 0));
    }

    #[tokio::test]
    async fn only_an_admitted_ticket_of_this_user_and_voucher_in_its_window_buys() {
        let rooms = rooms();
        let v = |id| VoucherId::new(id).unwrap();
        let u = |id| UserId::new(id).unwrap();
        let now = Utc::now();
        let until = now.timestamp_millis() + 5_000;
        let admitted = rooms.sign(&Ticket {
            voucher_id: v(3),
            user_id: u(7),
            place: 2,
            admitted_until_ms: until,
            expires_unix: until / 1000,
        });
        assert!(rooms
            .check_admitted(v(3), u(7), Some(&admitted), now)
            .is_ok());
        let later = now + chrono::Duration::seconds(6);
        for (voucher, user, ticket, at) in [
            (3, 8, Some(admitted.as_str()), now),
            (4, 7, Some(admitted.as_str()), now),
            (3, 7, Some(admitted.as_str()), later),
            (3, 7, None, now),
        ] {
            assert!(matches!(
                rooms.check_admitted(v(voucher), u(user), ticket, at),
                Err(crate::seckill::Refusal::NotAdmitted(_))
            ));
        }
        let waiting = rooms.sign(&Ticket {
            voucher_id: v(3),
            user_id: u(7),
            place: 2,
            admitted_until_ms: 0,
            expires_unix: until / 1000,
        });
        assert!(rooms
            .check_admitted(v(3), u(7), Some(&waiting), now)
            .is_err());
        assert!(rooms.check_own(v(3), u(7), &waiting).is_ok());
        // A forged one: the admission raised by hand.
        let forged = waiting.replacen(".2.0.", &format!(".2.{until}."), 1);
        assert_ne!(forged, waiting);
        assert!(rooms
            .check_admitted(v(3), u(7), Some(&forged), now)
            .is_err());
        assert!(rooms.check_own(v(3), u(7), &forged).is_err());
        // Another key's ticket.
        let other = Rooms::new(
            Kv::new(
                redis::Client::open("redis://127.0.0.1:1").unwrap(),
                Duration::from_secs(1),
            ),
            String::new(),
            &ticket_key(b"another key"),
        );
        assert!(other
            .check_admitted(v(3), u(7), Some(&admitted), now)
            .is_err());
    }
}
