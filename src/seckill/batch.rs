//! Group commit: the sale batcher. Purchases of one voucher that passed the
//! window, the sold-out flag and the user's lock join the voucher's next
//! batch; one writer per voucher (in each instance) commits a batch in one
//! statement (`store::SELL_BATCH`) and gives every purchase its own answer.
//!
//! Batching is natural, as in a database's group commit: a lone purchase
//! is written at once; while a batch's commit is in flight, arrivals gather
//! in the queue and form the next batch, up to a cap. No timer ever makes a
//! buyer wait for company. One commit, so one WAL flush and one turn on the
//! voucher's row lock, then serves the whole batch.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::clock::SaleClock;
use super::error::{Result, SeckillError};
use super::gate::{Gates, Ticket};
use super::metric;
use super::soldout::SoldOutFlags;
use super::user_lock::{UserGuard, UserLocks};
use super::workers::{Background, Queue, Workers};
use crate::domain::{day_range, OrderId, UserId, VoucherId};
use crate::domain::{StockLevel, Voucher};
use crate::id::IdGenerator;
use crate::store::{BatchSale, Sale, SaleRequest, Store, StoreError};

/// A writer with nothing to do for this long stops (the next purchase of
/// its voucher starts another).
const IDLE: Duration = Duration::from_secs(30);
/// Times a purchase may draw a new id because its id was taken already.
const REDRAWS: u8 = 3;
/// Times a batch is run again after a concurrent batch committed an order
/// of one of its users (or one of its ids) after its snapshot.
const RERUNS: u64 = 3;

/// What the batch did for one purchase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Sold(OrderId),
    SoldOut,
    /// The user holds this order already.
    Held(Option<OrderId>),
    /// A newer holder of the user's lock wrote first.
    Fenced,
    /// The user has as many orders of the voucher as it allows.
    TooMany,
}

/// A purchase waiting for its batch.
struct Pending {
    voucher: Arc<Voucher>,
    user_id: UserId,
    fence: Option<i64>,
    redraws: u8,
    reply: oneshot::Sender<Result<Outcome>>,
    /// The user's lock, given back (with the rest of its batch's, in one
    /// call) just before the purchase is answered.
    guard: UserGuard,
    /// The purchase's place at the gate, given up when it is answered (or
    /// dropped): those waiting there wake.
    _place: Ticket,
}

/// The batchers of every voucher. Cheap to clone.
#[derive(Clone)]
pub(super) struct Batcher {
    inner: Arc<Inner>,
}

struct Inner {
    deps: Deps,
    /// Most purchases in one batch; 1 is one order per transaction.
    max: usize,
    /// Each voucher's writer, by its queue.
    writers: Workers<Queue<Pending>>,
}

/// What the batch writers work with, from the rest of the instance.
pub(super) struct Deps {
    pub(super) store: Store,
    pub(super) ids: IdGenerator,
    pub(super) flags: Arc<SoldOutFlags>,
    pub(super) gates: Arc<Gates>,
    pub(super) locks: UserLocks,
    pub(super) clock: SaleClock,
}

impl Batcher {
    /// Batchers of at most `max` purchases per batch, whose writers run
    /// among `background`'s tasks.
    pub(super) fn new(deps: Deps, max: usize, background: Background) -> Self {
        Self {
            inner: Arc::new(Inner {
                deps,
                max: max.max(1),
                writers: Workers::new(background),
            }),
        }
    }

    /// Sells one unit of `voucher` to `user_id`, who holds the lock
    /// `guard` and the gate's `place`, in the voucher's next batch. The
    /// batch gives the lock back before it answers. If this future is
    /// dropped while its batch commits, the order stands.
    pub(super) async fn sell(
        &self,
        voucher: Arc<Voucher>,
        user_id: UserId,
        guard: UserGuard,
        place: Ticket,
    ) -> Result<Outcome> {
        let voucher_id = voucher.id;
        let fence = guard.fence();
        self.inner
            .writers
            .ask(
                voucher_id,
                |reply| Pending {
                    voucher,
                    user_id,
                    fence,
                    redraws: 0,
                    reply,
                    guard,
                    _place: place,
                },
                None,
                |arrivals, stop| write(self.inner.clone(), voucher_id, arrivals, stop),
            )
            .await
            .map_err(|_| SeckillError::internal("the sale writer stopped"))?
    }
}

/// One voucher's writer: takes what has arrived (up to the cap), commits
/// it, answers, and again, until idle (at shutdown, until its queue is
/// empty).
async fn write(
    inner: Arc<Inner>,
    voucher_id: VoucherId,
    mut arrivals: mpsc::UnboundedReceiver<Pending>,
    stop: CancellationToken,
) {
    // Purchases held back from a batch: a second purchase of a user already
    // in it, or one whose id was taken. They go first in the next batch.
    let mut waiting: VecDeque<Pending> = VecDeque::new();
    let mut retiring = false;
    loop {
        if waiting.is_empty() {
            if retiring {
                return;
            }
            // `None`: idle for IDLE, or shutdown: time to retire.
            let arrived = tokio::select! {
                arrived = tokio::time::timeout(IDLE, arrivals.recv()) => arrived.ok(),
                () = stop.cancelled() => None,
            };
            match arrived {
                Some(Some(pending)) => waiting.push_back(pending),
                Some(None) => return,
                None => retiring = inner.writers.retire_idle(voucher_id, &mut arrivals),
            }
        }
        while waiting.len() < inner.max {
            match arrivals.try_recv() {
                Ok(pending) => waiting.push_back(pending),
                Err(_) => break,
            }
        }
        let batch = take_batch(&mut waiting, inner.max);
        if !batch.is_empty() {
            let redo = commit(&inner, voucher_id, batch).await;
            for pending in redo.into_iter().rev() {
                waiting.push_front(pending);
            }
        }
    }
}

/// The next batch: up to `max` purchases in arrival order, one per user (a
/// second purchase of a user waits for the next batch, where it finds the
/// first one's order). Purchases whose client left are dropped here: nobody
/// waits for their answer and nothing was written for them.
fn take_batch(waiting: &mut VecDeque<Pending>, max: usize) -> Vec<Pending> {
    let mut batch = Vec::new();
    let mut users = HashSet::new();
    let mut later = VecDeque::new();
    while let Some(pending) = waiting.pop_front() {
        if pending.reply.is_closed() {
            continue;
        }
        if batch.len() < max && users.insert(pending.user_id) {
            batch.push(pending);
        } else {
            later.push_back(pending);
        }
    }
    *waiting = later;
    batch
}

/// Commits one batch and answers it; returns the purchases to put in the
/// next batch (those whose drawn id was taken).
async fn commit(inner: &Inner, voucher_id: VoucherId, batch: Vec<Pending>) -> Vec<Pending> {
    let batch = answer_known_sold_out(inner, batch).await;
    if batch.is_empty() {
        return Vec::new();
    }
    metrics::histogram!(metric::SALE_BATCH_SIZE).record(batch.len() as f64);
    let size = u32::try_from(batch.len()).unwrap_or(u32::MAX);
    let ids = match inner.deps.ids.next_ids(size).await {
        Ok(ids) => ids,
        Err(error) => {
            answer(inner, failed(batch, &SeckillError::from(error))).await;
            return Vec::new();
        }
    };
    // Created now on the sale's clock: the payment deadline counts from it.
    let at = inner.deps.clock.now();
    let requests: Vec<SaleRequest> = batch
        .iter()
        .zip(&ids)
        .map(|(pending, id)| SaleRequest {
            order_id: *id,
            user_id: pending.user_id,
            fence: pending.fence,
            at,
        })
        .collect();
    let max_orders = batch[0].voucher.terms.max_orders_per_user;
    match sell_batch(&inner.deps.store, voucher_id, max_orders, &requests).await {
        Ok(sold) => settle(inner, voucher_id, batch, ids, sold).await,
        // Every rerun met another batch's order of one of its users: the
        // statement rolled back, so nobody in it bought here, and not all
        // of them hold an order elsewhere. A retry finds out which.
        Err(StoreError::DuplicateOrder) => {
            let error = SeckillError::postgres_unavailable(
                "the batch kept meeting concurrent orders of its users",
            );
            answer(inner, failed(batch, &error)).await;
            Vec::new()
        }
        Err(error) => {
            answer(inner, failed(batch, &SeckillError::from(error))).await;
            Vec::new()
        }
    }
}

/// Answers the purchases that passed the flag just before this instance
/// saw their voucher sold out (they need no statement to learn it); the
/// others, still open.
async fn answer_known_sold_out(inner: &Inner, batch: Vec<Pending>) -> Vec<Pending> {
    let mut open = Vec::with_capacity(batch.len());
    let mut known = Vec::new();
    for pending in batch {
        if inner.deps.flags.known_sold_out(&pending.voucher).await {
            known.push((pending, Ok(Outcome::SoldOut)));
        } else {
            open.push(pending);
        }
    }
    answer(inner, known).await;
    open
}

/// After a committed batch: the gate and the flags told what it left,
/// every purchase answered, what it left published; returns the purchases
/// whose ids were taken, with new ids to draw.
async fn settle(
    inner: &Inner,
    voucher_id: VoucherId,
    batch: Vec<Pending>,
    ids: Vec<OrderId>,
    BatchSale { sales, level }: BatchSale,
) -> Vec<Pending> {
    // Before anyone is answered: those waiting at the gate for this batch
    // find what it left when they wake, and when it left no unit, those
    // who come after (the answered buyers' next tries among them) are
    // refused at the flag, not after a lock and a batch of their own.
    if let Some(level) = level {
        if level.stock == 0 {
            inner
                .deps
                .flags
                .saw_sold_out(voucher_id, level.epoch())
                .await;
        }
        inner.deps.gates.saw(voucher_id, level);
    }
    let voucher = batch[0].voucher.clone();
    let mut redo = Vec::new();
    let mut answers = Vec::with_capacity(batch.len());
    let mut taken_id = None;
    let mut sold_out = false;
    for ((pending, sale), id) in batch.into_iter().zip(sales).zip(ids) {
        let outcome = match sale {
            Sale::Sold => Outcome::Sold(id),
            Sale::SoldOut => {
                sold_out = true;
                Outcome::SoldOut
            }
            Sale::Held(order_id) => Outcome::Held(Some(order_id)),
            Sale::Fenced => Outcome::Fenced,
            Sale::TooMany => Outcome::TooMany,
            Sale::IdTaken => {
                taken_id = Some(id);
                redo.push(pending);
                continue;
            }
        };
        answers.push((pending, Ok(outcome)));
    }
    answer(inner, answers).await;
    if let Some(taken) = taken_id {
        redo = redraw(inner, taken, redo).await;
    }
    publish(inner, &voucher, level, sold_out).await;
    redo
}

/// Commits one batch of `voucher_id` (`store::SELL_BATCH`), running it
/// again if a concurrent batch committed one of its users' orders (or ids)
/// after the statement's snapshot: the next run sees it. The sync writer
/// above and the async sale's stream writer both write through here.
pub(super) async fn sell_batch(
    store: &Store,
    voucher_id: VoucherId,
    max_orders: i32,
    requests: &[SaleRequest],
) -> std::result::Result<BatchSale, StoreError> {
    let started = Instant::now();
    let mut reruns = 0;
    let sold = loop {
        match store.sell_batch(voucher_id, max_orders, requests).await {
            Err(StoreError::DuplicateOrder | StoreError::DuplicateOrderId) if reruns < RERUNS => {
                reruns += 1;
            }
            other => break other,
        }
    };
    metrics::histogram!(metric::SALE_COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
    metrics::counter!(metric::SALE_BATCH_RERUNS).increment(reruns);
    sold
}

/// The purchases whose ids were taken, after the day's counter was raised
/// past the ids Postgres holds; those that drew too often are answered 503.
async fn redraw(inner: &Inner, taken: OrderId, redo: Vec<Pending>) -> Vec<Pending> {
    tracing::warn!(%taken, "order id already taken: the id counter was lost");
    if let Err(error) = recover_id_counter(inner, taken).await {
        answer(inner, failed(redo, &error)).await;
        return Vec::new();
    }
    let (again, spent): (Vec<_>, Vec<_>) = redo
        .into_iter()
        .map(|mut pending| {
            pending.redraws += 1;
            pending
        })
        .partition(|pending| pending.redraws <= REDRAWS);
    let error = SeckillError::redis_unavailable(
        "the order-id counter keeps handing out ids that are taken",
    );
    answer(inner, failed(spent, &error)).await;
    again
}

/// Raises the day's id counter of `taken` past every id Postgres holds for
/// that day.
async fn recover_id_counter(inner: &Inner, taken: OrderId) -> Result<()> {
    raise_id_counter(&inner.deps.store, &inner.deps.ids, taken.drawn_at(), 0).await?;
    metrics::counter!(metric::ID_COUNTER_RECOVERIES).increment(1);
    Ok(())
}

/// Raises the id counter of `day` past every id Postgres holds for that
/// day and past `at_least` (ids known to be handed out but not stored).
pub(super) async fn raise_id_counter(
    store: &Store,
    ids: &IdGenerator,
    day: chrono::DateTime<chrono::Utc>,
    at_least: u32,
) -> Result<()> {
    let range = day_range(day).ok_or_else(|| {
        SeckillError::redis_unavailable("Redis's clock is outside the order id range")
    })?;
    let highest = store.highest_sequence(range).await?.max(at_least);
    ids.raise_day(day, highest).await?;
    tracing::info!(%day, highest, "raised the order-id counter past the ids already used");
    Ok(())
}

/// Tells every instance the voucher is sold out when this batch saw it so:
/// the stock it left at 0, or (when it sold nothing) the stock read now.
async fn publish(inner: &Inner, voucher: &Voucher, level: Option<StockLevel>, sold_out: bool) {
    let level = match level {
        Some(level) => Some(level),
        None if sold_out => inner
            .deps
            .store
            .stock_level(voucher.id)
            .await
            .ok()
            .flatten(),
        None => None,
    };
    if let Some(level) = level.filter(|l| l.stock == 0) {
        inner
            .deps
            .flags
            .publish(
                voucher.id,
                voucher.terms.end_time,
                level,
                inner.deps.clock.now(),
            )
            .await;
    }
}

/// Every purchase of `batch`, answered `error`.
fn failed(batch: Vec<Pending>, error: &SeckillError) -> Vec<(Pending, Result<Outcome>)> {
    batch
        .into_iter()
        .map(|pending| (pending, Err(error.clone())))
        .collect()
}

/// Gives back the users' locks of these purchases (one Redis call for up to
/// `redis_locks::LOCKS_PER_CALL` of them), then answers each: a buyer hears
/// once the lock is free, so a retry finds the order, not the lock. A lock
/// that cannot be given back runs out with its lease; the answer stands
/// (the order, if any, is committed, and the unique index keeps it single).
async fn answer(inner: &Inner, answers: Vec<(Pending, Result<Outcome>)>) {
    if answers.is_empty() {
        return;
    }
    let mut guards = Vec::with_capacity(answers.len());
    let mut replies = Vec::with_capacity(answers.len());
    for (pending, outcome) in answers {
        let Pending {
            voucher,
            user_id,
            reply,
            guard,
            ..
        } = pending;
        guards.push(guard);
        replies.push((voucher.id, user_id, reply, outcome));
    }
    let released = inner.deps.locks.unlock_all(guards).await;
    for ((voucher_id, user_id, reply, outcome), released) in replies.into_iter().zip(released) {
        if let Err(error) = released {
            tracing::warn!(%user_id, %voucher_id, %error, "releasing the purchase lock failed");
        }
        let _ = reply.send(outcome);
    }
}
