//! Reconciliation: Postgres is the truth. Redis's side of an async sale
//! (stock, buyers, the orders whose units were given back, each user's
//! count of orders for `max_orders_per_user`) is rebuilt from
//! one Postgres snapshot plus the stream's orders not yet written, while
//! the sale is paused.
//!
//! The order of reads makes it exact without stopping the writers: the
//! sale is paused first (its hash deleted: the purchase script answers
//! "not loaded" and appends nothing), then the stream is read, then
//! Postgres. An entry the writers commit between the two reads is in the
//! stream read and in the snapshot, so it counts once, as stored.
//!
//! Reconciliations of one voucher may overlap (an admin's, a restock's,
//! every instance loading a sale it sees for the first time): each pauses
//! under a token of its own, and only the one whose token is still
//! recorded reopens the sale (`lua/async_pause.lua`, `lua/async_reopen.lua`).
//! Its snapshot, taken after its own pause, is exact; an older one that
//! finished last would have set the stock from before purchases it never
//! saw, and sold those units twice.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;
use std::time::Duration;

use redis::{self, Script, ToRedisArgs};
use serde::Serialize;
use tokio_util::task::AbortOnDropHandle;

use super::{writer, Accepted, AsyncSales, SaleKeys};
use crate::domain::SaleMode;
use crate::domain::{OrderId, UserId, VoucherId};
use crate::seckill::batch::raise_id_counter;
use crate::seckill::error::{Result, SeckillError};
use crate::seckill::metric;
use crate::telemetry::Chain;

/// Most members (or field-value pairs) in one write of a staged set.
const CHUNK: usize = 1_000;
/// How long a staged set outlives a reconciliation that died before its
/// swap (deleted at the swap or the release otherwise).
const STAGED_MS: u64 = 600_000;
/// A reconciliation's lease, in the instance's dependency deadlines: it
/// counts as under way while a task beside it renews the lease (every
/// third of it); one that died (killed, frozen) holds back the others'
/// rebuild, and the sale's purchases, until the lease runs out.
const LEASE_IN_DEADLINES: u32 = 10;
/// The shortest lease.
const LEASE_AT_LEAST: Duration = Duration::from_secs(3);

static PAUSE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/async_pause.lua")));
static REOPEN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/async_reopen.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/async_release.lua")));
static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../lua/async_renew.lua")));

/// When a reconciliation pauses the sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// Always (an admin's reconciliation, a restock).
    Always,
    /// Only if no reconciliation is under way and the sale is not in Redis
    /// (a sale created; one Redis lost, or a failed reconciliation left
    /// paused) or was built from an initial stock below this one (a
    /// restock whose rebuild failed). `IfBehind(0)`: only if missing.
    IfBehind(i64),
}

/// What a reconciliation came to.
#[derive(Debug, Clone)]
pub enum Reconciliation {
    Done(Reconciled),
    /// A later reconciliation took over before this one reopened the
    /// sale; that one reopens it.
    Superseded,
    /// [`Pause::IfBehind`] and the sale is loaded and current: nothing done.
    Loaded,
    /// [`Pause::IfBehind`] and another reconciliation is under way:
    /// nothing done (that one reopens the sale, or releases it failing).
    UnderWay,
}

/// What a reconciliation found and set.
#[derive(Debug, Clone, Serialize)]
pub struct Reconciled {
    pub voucher_id: VoucherId,
    /// The stock Redis sells from now: Postgres's, less the units of the
    /// accepted orders still waiting in the stream.
    pub stock: i64,
    /// Accepted orders not yet in Postgres (left in the stream for the
    /// writers).
    pub pending: usize,
    /// Users recorded as buyers (stored or pending).
    pub buyers: usize,
    /// Orders Redis accepted that Postgres refused, with the reason.
    pub unstored: Vec<Unstored>,
}

/// Where a reconciliation builds the sale's sets before the swap.
struct Staged {
    buyers: String,
    returned: String,
    orders_per_user: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Unstored {
    pub order_id: String,
    pub reason: String,
}

impl AsyncSales {
    /// Rebuilds Redis's side of `voucher_id`'s async sale from Postgres and
    /// the unwritten stream entries, then reopens it. Runs to its end on a
    /// task of its own among the instance's background tasks: a caller that
    /// goes away (a client hanging up on an admin request) does not leave
    /// the sale paused half-way, and shutdown waits for it.
    pub(in crate::seckill) async fn reconcile(
        &self,
        voucher_id: VoucherId,
        pause: Pause,
    ) -> Result<Reconciliation> {
        let sales = self.clone();
        let tasks = &self.inner.background.tasks;
        tasks
            .spawn(async move { sales.reconcile_to_end(voucher_id, pause).await })
            .await
            .map_err(|error| SeckillError::internal_from("a reconciliation failed", error))?
    }

    async fn reconcile_to_end(
        &self,
        voucher_id: VoucherId,
        pause: Pause,
    ) -> Result<Reconciliation> {
        let inner = &self.inner;
        // Refused before the pause: a refusal touches nothing of a sale
        // (an id no voucher has yet may be an async sale's tomorrow).
        let voucher = inner
            .store
            .voucher(voucher_id)
            .await?
            .ok_or(SeckillError::NotFound("voucher"))?;
        if voucher.terms.sale_mode != SaleMode::Async {
            return Err(SeckillError::Invalid(
                "this voucher is sold synchronously: it has nothing in Redis to reconcile".into(),
            ));
        }
        let keys = self.keys(voucher_id);
        // Pause: purchases answer 503 until the sale hash is back.
        let token = uuid::Uuid::new_v4().simple().to_string();
        let staged = Staged {
            buyers: format!("{}:{token}", keys.buyers),
            returned: format!("{}:{token}", keys.returned),
            orders_per_user: format!("{}:{token}", keys.orders_per_user),
        };
        let paused = inner
            .redis
            .invoke::<i64>(
                PAUSE
                    .key(&keys.sale)
                    .key(&keys.reconciling)
                    .arg(&token)
                    .arg(self.lease_ms())
                    .arg(match pause {
                        Pause::Always => String::new(),
                        Pause::IfBehind(initial) => initial.to_string(),
                    }),
            )
            .await;
        let rebuilt = match paused {
            Ok(1) => {
                // The lease is renewed beside the rebuild for as long as it
                // runs (until this is dropped), whatever each step takes.
                let _heartbeat = self.renew_while_running(&keys, &token);
                self.rebuild(voucher_id, &keys, &token, &staged).await
            }
            Ok(0) => return Ok(Reconciliation::Loaded),
            Ok(_) => return Ok(Reconciliation::UnderWay),
            // Unanswered, the pause may still be applied (a Redis stuck, not
            // gone, runs it when it wakes): its token is released as below.
            Err(error) => Err(error.into()),
        };
        if rebuilt.is_err() {
            // The sale stays paused; the next reconciliation (every
            // supervisor's, within a second) need not wait for this one's
            // token to expire.
            self.release(voucher_id, keys, staged, token);
        }
        rebuilt
    }

    /// Ends a reconciliation that failed after it paused the sale, or may
    /// have: its token and staged keys go (`lua/async_release.lua`). Sent
    /// until Redis answers (once a second, on a task of its own: the
    /// failure is answered at once), for at most the token's life, or until
    /// the instance stops.
    fn release(&self, voucher_id: VoucherId, keys: SaleKeys, staged: Staged, token: String) {
        let sales = self.clone();
        let background = &self.inner.background;
        let stop = background.stop.clone();
        background.tasks.spawn(async move {
            let give_up = tokio::time::Instant::now() + Duration::from_millis(sales.lease_ms());
            for attempt in 0.. {
                let mut release = RELEASE.key(&keys.reconciling);
                release
                    .key(&staged.buyers)
                    .key(&staged.returned)
                    .key(&staged.orders_per_user)
                    .arg(&token);
                match sales.inner.redis.invoke::<i64>(&release).await {
                    Ok(_) => return,
                    Err(error) if attempt == 0 => {
                        tracing::warn!(%voucher_id, error = %Chain(&error),
                        "could not release a failed reconciliation; trying again each second")
                    }
                    Err(_) => {}
                }
                if tokio::time::Instant::now() >= give_up {
                    return;
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
    }

    /// Writes `members` (field-value pairs for HSET, members for SADD) into
    /// the staging key `key` with `command`, in chunks; the key expires by
    /// itself if the reconciliation dies before the swap.
    async fn stage<T: ToRedisArgs>(&self, command: &str, key: &str, members: &[T]) -> Result<()> {
        for (i, chunk) in members.chunks(CHUNK).enumerate() {
            let mut write = redis::cmd(command);
            write.arg(key).arg(chunk);
            self.inner.redis.query::<()>(&write).await?;
            if i == 0 {
                let expire = redis::cmd("PEXPIRE").arg(key).arg(STAGED_MS).clone();
                self.inner.redis.query::<()>(&expire).await?;
            }
        }
        Ok(())
    }

    /// A reconciliation's lease on the sale, in ms.
    fn lease_ms(&self) -> u64 {
        let lease = (self.inner.redis.timeout() * LEASE_IN_DEADLINES).max(LEASE_AT_LEAST);
        u64::try_from(lease.as_millis()).unwrap_or(u64::MAX)
    }

    /// Renews the lease of the reconciliation `token` every third of it,
    /// until the handle is dropped or the lease is another's (it ran out:
    /// the rebuild's reopen will be refused). A renewal that fails is tried
    /// again at the next turn.
    fn renew_while_running(&self, keys: &SaleKeys, token: &str) -> AbortOnDropHandle<()> {
        let (sales, key, token) = (self.clone(), keys.reconciling.clone(), token.to_owned());
        AbortOnDropHandle::new(tokio::spawn(async move {
            let lease = sales.lease_ms();
            loop {
                tokio::time::sleep(Duration::from_millis(lease / 3)).await;
                let renewed = sales
                    .inner
                    .redis
                    .invoke::<i64>(RENEW.key(&key).arg(&token).arg(lease))
                    .await;
                if matches!(renewed, Ok(0)) {
                    return;
                }
            }
        }))
    }

    /// The reconciliation's work once the sale is paused under `token`.
    async fn rebuild(
        &self,
        voucher_id: VoucherId,
        keys: &SaleKeys,
        token: &str,
        staged: &Staged,
    ) -> Result<Reconciliation> {
        let inner = &self.inner;
        let accepted = self.accepted(voucher_id).await?;
        let snapshot = inner
            .store
            .sale_snapshot(voucher_id, accepted.iter().map(|a| a.order_id).collect())
            .await?
            .ok_or(SeckillError::NotFound("voucher"))?;
        let stored: HashSet<OrderId> = snapshot.stored.iter().copied().collect();
        let mut buyers: HashMap<UserId, OrderId> = snapshot.buyers.iter().copied().collect();
        let mut orders_per_user: HashMap<UserId, i64> =
            snapshot.orders_per_user.iter().copied().collect();
        let mut pending = 0;
        let mut pending_units = 0;
        for Accepted {
            order_id,
            user_id,
            quantity,
        } in &accepted
        {
            if !stored.contains(order_id) && !buyers.contains_key(user_id) {
                buyers.insert(*user_id, *order_id);
                *orders_per_user.entry(*user_id).or_default() += 1;
                pending += 1;
                pending_units += i64::from(quantity.get());
            }
        }
        let stock = (i64::from(snapshot.voucher.level.stock) - pending_units).max(0);
        self.raise_id_counter_past(&accepted).await?;

        // The buyers are rebuilt aside, and replace the live ones as the
        // sale reopens, in one step.
        let pairs: Vec<(UserId, OrderId)> = buyers.into_iter().collect();
        self.stage("HSET", &staged.buyers, &pairs).await?;
        // Orders closed in this snapshot: their units are in its stock, so
        // a return of one of them still queued for Redis changes nothing.
        self.stage("SADD", &staged.returned, &snapshot.closed)
            .await?;
        // What max_orders_per_user bounds: every order of each user, stored
        // (of any status) or accepted and still to be written.
        let counts: Vec<(UserId, i64)> = orders_per_user.into_iter().collect();
        self.stage("HSET", &staged.orders_per_user, &counts).await?;
        if !writer::ensure_group(self, keys).await {
            return Err(SeckillError::redis_unavailable(
                "cannot create the sale's consumer group",
            ));
        }
        let voucher = &snapshot.voucher;
        // Never opens early, never sells late: the window to the millisecond
        // inside the microsecond one.
        let begin_ms = (voucher.terms.begin_time.timestamp_micros() + 999).div_euclid(1000);
        let end_ms = voucher.terms.end_time.timestamp_micros().div_euclid(1000);
        let reopened: i64 = inner
            .redis
            .invoke(
                REOPEN
                    .key(&keys.sale)
                    .key(&keys.buyers)
                    .key(&staged.buyers)
                    .key(&keys.reconciling)
                    .key(&keys.returned)
                    .key(&staged.returned)
                    .key(&keys.orders_per_user)
                    .key(&staged.orders_per_user)
                    .arg(token)
                    .arg(stock)
                    .arg(begin_ms)
                    .arg(end_ms)
                    .arg(voucher.level.initial_stock),
            )
            .await?;
        if reopened != 1 {
            tracing::info!(%voucher_id, "a later reconciliation took over");
            return Ok(Reconciliation::Superseded);
        }

        metrics::counter!(metric::ASYNC_RECONCILIATIONS).increment(1);
        Ok(Reconciliation::Done(Reconciled {
            voucher_id,
            stock,
            pending: usize::try_from(pending).unwrap_or(0),
            buyers: pairs.len(),
            unstored: self.unstored(keys).await?,
        }))
    }

    /// A Redis that lost the sale lost the day's id counter too: it would
    /// hand out ids that orders hold already. Raised past those stored and
    /// those `accepted` before the sale reopens.
    async fn raise_id_counter_past(&self, accepted: &[Accepted]) -> Result<()> {
        let inner = &self.inner;
        let today = inner.clock.now();
        let day = crate::domain::day_range(today);
        let accepted_today = accepted
            .iter()
            .map(|a| a.order_id)
            .filter(|order| day.as_ref().is_some_and(|d| d.contains(&order.get())))
            .map(OrderId::sequence)
            .max()
            .unwrap_or(0);
        raise_id_counter(&inner.store, &inner.ids, today, accepted_today).await?;
        Ok(())
    }

    /// The orders Postgres refused that the sale's writers reported, by id.
    async fn unstored(&self, keys: &SaleKeys) -> Result<Vec<Unstored>> {
        let unstored: HashMap<String, String> = self
            .inner
            .redis
            .query(redis::cmd("HGETALL").arg(&keys.unstored))
            .await?;
        let mut unstored: Vec<Unstored> = unstored
            .into_iter()
            .map(|(order_id, reason)| Unstored { order_id, reason })
            .collect();
        unstored.sort_by(|a, b| a.order_id.cmp(&b.order_id));
        Ok(unstored)
    }
}
