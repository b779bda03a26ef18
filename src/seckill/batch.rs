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

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::clock::SaleClock;
use super::error::{Result, SeckillError};
use super::gate::{Gates, Place};
use super::metric;
use super::soldout::SoldOutFlags;
use super::user_lock::{LockBackend, UserGuard};
use super::workers::{InstanceTasks, Queue, Workers};
use crate::domain::{day_range, FencingToken, OrderId, Quantity, UserId, VoucherId};
use crate::domain::{StockLevel, Voucher};
use crate::id::IdGenerator;
use crate::store::{BatchSale, Sale, SaleRequest, Store, StoreError};
use crate::telemetry::Chain;

/// A writer with nothing to do for this long stops (the next purchase of
/// its voucher starts another).
const IDLE: Duration = Duration::from_secs(30);
/// Times a purchase may draw a new id because its id was taken already.
const REDRAWS: u8 = 3;
/// Times a batch is run again after a concurrent batch committed an order
/// of one of its users (or one of its ids) after its snapshot.
const RERUNS: u64 = 3;
/// Longest a committed batch's buyers wait for their locks' release before
/// they are answered (see `answer`).
const RELEASE_WAIT: Duration = Duration::from_millis(250);

/// What the batch did for one purchase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Sold(OrderId),
    SoldOut,
    /// Fewer units than asked were left: this many, after the batch.
    Short(i32),
    /// The user holds this order already.
    Held(Option<OrderId>),
    /// A newer holder of the user's lock wrote first.
    Fenced,
    /// The user has as many orders of the voucher as it allows.
    TooMany,
}

/// A purchase waiting for its batch.
struct Queued {
    voucher: Arc<Voucher>,
    user_id: UserId,
    quantity: Quantity,
    fence: Option<FencingToken>,
    redraws: u8,
    reply: oneshot::Sender<Result<Outcome>>,
    /// The user's lock, given back (with the rest of its batch's, in one
    /// call) just before the purchase is answered.
    guard: UserGuard,
    /// The purchase's place at the gate, given up when it is answered (or
    /// dropped): those waiting there wake.
    _place: Place,
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
    writers: Workers<Queue<Queued>>,
    /// Where a release that outlasts [`RELEASE_WAIT`] goes on: the
    /// instance's shutdown waits for it.
    background: InstanceTasks,
}

/// What the batch writers work with, from the rest of the instance.
pub(super) struct Deps {
    pub(super) store: Store,
    pub(super) ids: IdGenerator,
    pub(super) flags: Arc<SoldOutFlags>,
    pub(super) gates: Arc<Gates>,
    pub(super) locks: LockBackend,
    pub(super) clock: SaleClock,
}

impl Batcher {
    /// Batchers of at most `max` purchases per batch, whose writers run
    /// among `background`'s tasks.
    pub(super) fn new(deps: Deps, max: usize, background: InstanceTasks) -> Self {
        Self {
            inner: Arc::new(Inner {
                deps,
                max: max.max(1),
                writers: Workers::new(background.clone()),
                background,
            }),
        }
    }

    /// Sells `quantity` units of `voucher` to `user_id` (all or none), who
    /// holds the lock `guard` and the gate's `place`, in the voucher's next
    /// batch. The batch gives the lock back before it answers. If this
    /// future is dropped while its batch commits, the order stands.
    pub(super) async fn sell(
        &self,
        voucher: Arc<Voucher>,
        user_id: UserId,
        quantity: Quantity,
        guard: UserGuard,
        place: Place,
    ) -> Result<Outcome> {
        let voucher_id = voucher.id;
        let fence = guard.fence();
        self.inner
            .writers
            .ask(
                voucher_id,
                |reply| Queued {
                    voucher,
                    user_id,
                    quantity,
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
            .map_err(|_| {
                // Only at shutdown: the writer stops with its queue served.
                SeckillError::postgres_unavailable("the sale's writer stopped before answering")
            })?
    }
}

/// One voucher's writer: takes what has arrived (up to the cap), commits
/// it, answers, and again, until idle (at shutdown, until its queue is
/// empty).
async fn write(
    inner: Arc<Inner>,
    voucher_id: VoucherId,
    mut arrivals: mpsc::UnboundedReceiver<Queued>,
    stop: CancellationToken,
) {
    // Purchases held back from a batch: a second purchase of a user already
    // in it, or one whose id was taken. They go first in the next batch.
    let mut waiting: VecDeque<Queued> = VecDeque::new();
    let mut retiring = false;
    loop {
        if waiting.is_empty() {
            if retiring {
                // The queue is closed; a purchase sent between the last look
                // and the close is still this writer's to answer.
                match arrivals.recv().await {
                    Some(pending) => waiting.push_back(pending),
                    None => return,
                }
                continue;
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
fn take_batch(waiting: &mut VecDeque<Queued>, max: usize) -> Vec<Queued> {
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
async fn commit(inner: &Inner, voucher_id: VoucherId, batch: Vec<Queued>) -> Vec<Queued> {
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
    let requests = sale_requests(&batch, &ids, inner.deps.clock.now());
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

/// The statement's requests for `batch`, whose purchases drew `ids`, in
/// order: each with its own id and its lock's fencing token (none without
/// a lock), created `at`.
fn sale_requests(batch: &[Queued], ids: &[OrderId], at: DateTime<Utc>) -> Vec<SaleRequest> {
    batch
        .iter()
        .zip(ids)
        .map(|(pending, id)| SaleRequest {
            order_id: *id,
            user_id: pending.user_id,
            fence: pending.fence,
            at,
            quantity: pending.quantity,
        })
        .collect()
}

/// Answers the purchases that passed the flag just before this instance
/// saw their voucher sold out (they need no statement to learn it); the
/// others, still open.
async fn answer_known_sold_out(inner: &Inner, batch: Vec<Queued>) -> Vec<Queued> {
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
    batch: Vec<Queued>,
    ids: Vec<OrderId>,
    BatchSale { sales, level }: BatchSale,
) -> Vec<Queued> {
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
        match verdict(sale, id) {
            Verdict::Answer(outcome) => {
                sold_out |= outcome == Outcome::SoldOut;
                answers.push((pending, Ok(outcome)));
            }
            Verdict::Redraw(taken) => {
                taken_id = Some(taken);
                redo.push(pending);
            }
        }
    }
    answer(inner, answers).await;
    if let Some(taken) = taken_id {
        redo = redraw(inner, taken, redo).await;
    }
    publish(inner, &voucher, level, sold_out).await;
    redo
}

/// What a committed batch's sale comes to for one purchase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The purchase's answer.
    Answer(Outcome),
    /// Its drawn id (this one) was taken: nothing was written for it, and
    /// it goes in the next batch with a new id.
    Redraw(OrderId),
}

/// What the batch's `sale` of one purchase, whose drawn order id was `id`,
/// comes to for it.
fn verdict(sale: Sale, id: OrderId) -> Verdict {
    Verdict::Answer(match sale {
        Sale::Sold => Outcome::Sold(id),
        Sale::SoldOut => Outcome::SoldOut,
        Sale::Short(left) => Outcome::Short(left),
        Sale::Held(order_id) => Outcome::Held(Some(order_id)),
        Sale::Fenced => Outcome::Fenced,
        Sale::TooMany => Outcome::TooMany,
        Sale::IdTaken => return Verdict::Redraw(id),
    })
}

/// Whether a batch that failed with `error`, run again `reruns` times so
/// far, runs once more: only when it met another batch's order (or id)
/// committed after its snapshot, and at most `RERUNS` times.
fn reruns_after(error: &StoreError, reruns: u64) -> bool {
    matches!(
        error,
        StoreError::DuplicateOrder | StoreError::DuplicateOrderId
    ) && reruns < RERUNS
}

/// Whether a purchase whose id was taken for the `redraws`th time (this
/// one counted) draws again, rather than being answered 503.
fn draws_again(redraws: u8) -> bool {
    redraws <= REDRAWS
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
            Err(error) if reruns_after(&error, reruns) => reruns += 1,
            other => break other,
        }
    };
    metrics::histogram!(metric::SALE_COMMIT_SECONDS).record(started.elapsed().as_secs_f64());
    metrics::counter!(metric::SALE_BATCH_RERUNS).increment(reruns);
    sold
}

/// The purchases whose ids were taken, after the day's counter was raised
/// past the ids Postgres holds; those that drew too often are answered 503.
async fn redraw(inner: &Inner, taken: OrderId, redo: Vec<Queued>) -> Vec<Queued> {
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
        .partition(|pending| draws_again(pending.redraws));
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
fn failed(batch: Vec<Queued>, error: &SeckillError) -> Vec<(Queued, Result<Outcome>)> {
    batch
        .into_iter()
        .map(|pending| (pending, Err(error.clone())))
        .collect()
}

/// Gives back the users' locks of these purchases (one Redis call for up to
/// `redis_locks::LOCKS_PER_CALL` of them), then answers each: a buyer hears
/// once the lock is free, so a retry finds the order, not the lock. A
/// release that takes longer than [`RELEASE_WAIT`] (a Redis frozen after the
/// commit) goes on without them: the buyers are answered, since what they
/// bought is committed and their purchases' deadline runs meanwhile. A lock
/// that cannot be given back runs out with its lease; the answer stands
/// (the order, if any, is committed, and the unique index keeps it single).
async fn answer(inner: &Inner, answers: Vec<(Queued, Result<Outcome>)>) {
    if answers.is_empty() {
        return;
    }
    let mut guards = Vec::with_capacity(answers.len());
    let mut whose = Vec::with_capacity(answers.len());
    let mut replies = Vec::with_capacity(answers.len());
    for (pending, outcome) in answers {
        let Queued {
            voucher,
            user_id,
            reply,
            guard,
            ..
        } = pending;
        guards.push(guard);
        whose.push((voucher.id, user_id));
        replies.push((reply, outcome));
    }
    let locks = inner.deps.locks.clone();
    let release = async move {
        let released = locks.unlock_all(guards).await;
        for ((voucher_id, user_id), released) in whose.into_iter().zip(released) {
            if let Err(error) = released {
                tracing::warn!(%user_id, %voucher_id, error = %Chain(&error), "releasing the purchase lock failed");
            }
        }
    };
    inner
        .background
        .wait_then_leave(RELEASE_WAIT, release)
        .await;
    for (reply, outcome) in replies {
        let _ = reply.send(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seckill::gate::Admission;

    fn order(sequence: u64) -> OrderId {
        OrderId::from_parts(100_000, sequence).unwrap()
    }

    /// Each sale the statement can answer, what it comes to for a purchase
    /// that drew `order(1)`.
    #[test]
    fn each_sale_comes_to_its_answer_and_a_taken_id_to_a_redraw() {
        let drawn = order(1);
        let stored = order(9);
        let cases = [
            (Sale::Sold, Verdict::Answer(Outcome::Sold(drawn))),
            (Sale::SoldOut, Verdict::Answer(Outcome::SoldOut)),
            (Sale::Short(2), Verdict::Answer(Outcome::Short(2))),
            // The order the user holds, not the id drawn for this try.
            (
                Sale::Held(stored),
                Verdict::Answer(Outcome::Held(Some(stored))),
            ),
            (Sale::Fenced, Verdict::Answer(Outcome::Fenced)),
            (Sale::TooMany, Verdict::Answer(Outcome::TooMany)),
            (Sale::IdTaken, Verdict::Redraw(drawn)),
        ];
        for (sale, expected) in cases {
            assert_eq!(verdict(sale, drawn), expected, "{sale:?}");
        }
    }

    #[test]
    fn every_purchase_of_a_batch_hears_its_own_sale_with_its_own_id() {
        let sales = [
            Sale::Sold,
            Sale::Fenced,
            Sale::Sold,
            Sale::IdTaken,
            Sale::Held(order(50)),
            Sale::TooMany,
            Sale::SoldOut,
            Sale::SoldOut,
        ];
        let ids: Vec<OrderId> = (1..=8).map(order).collect();
        let verdicts: Vec<Verdict> = sales
            .into_iter()
            .zip(&ids)
            .map(|(sale, id)| verdict(sale, *id))
            .collect();
        assert_eq!(
            verdicts,
            [
                Verdict::Answer(Outcome::Sold(order(1))),
                Verdict::Answer(Outcome::Fenced),
                Verdict::Answer(Outcome::Sold(order(3))),
                Verdict::Redraw(order(4)),
                Verdict::Answer(Outcome::Held(Some(order(50)))),
                Verdict::Answer(Outcome::TooMany),
                Verdict::Answer(Outcome::SoldOut),
                Verdict::Answer(Outcome::SoldOut),
            ]
        );
    }

    #[test]
    fn a_batch_runs_again_only_after_meeting_a_concurrent_order_and_at_most_reruns_times() {
        for concurrent in [StoreError::DuplicateOrder, StoreError::DuplicateOrderId] {
            for reruns in 0..RERUNS {
                assert!(
                    reruns_after(&concurrent, reruns),
                    "{concurrent:?} #{reruns}"
                );
            }
            assert!(!reruns_after(&concurrent, RERUNS), "{concurrent:?}");
        }
        for other in [
            StoreError::TimedOut(Duration::from_secs(1)),
            StoreError::Conflict(sqlx::Error::PoolTimedOut),
            StoreError::Other(sqlx::Error::RowNotFound),
        ] {
            assert!(!reruns_after(&other, 0), "{other:?}");
        }
    }

    #[test]
    fn a_purchase_whose_id_keeps_being_taken_draws_again_at_most_redraws_times() {
        let mut redraws = 0;
        while draws_again(redraws + 1) {
            redraws += 1;
        }
        assert_eq!(redraws, REDRAWS);
    }

    /// The receiver of a purchase's answer.
    type Answer = oneshot::Receiver<Result<Outcome>>;

    /// Purchases of a voucher in stock by `users` (each with the fence its
    /// lock gave it, if any), queued in that order through `gates`, and the
    /// receivers of their answers.
    async fn queued(
        gates: &Gates,
        users: impl IntoIterator<Item = (i64, Option<i64>)>,
    ) -> (VecDeque<Queued>, Vec<Answer>) {
        let voucher = in_stock();
        let (mut queue, mut answers) = (VecDeque::new(), Vec::new());
        for (user, fence) in users {
            let Admission::Go(place) = gates.admit(&voucher, Quantity::ONE).await else {
                panic!("the gate refused a purchase of a voucher in stock");
            };
            let (reply, answer) = oneshot::channel();
            queue.push_back(Queued {
                voucher: voucher.clone(),
                user_id: UserId::new(user).unwrap(),
                quantity: Quantity::ONE,
                fence: fence.map(FencingToken::new),
                redraws: 0,
                reply,
                guard: UserGuard::Unlocked,
                _place: place,
            });
            answers.push(answer);
        }
        (queue, answers)
    }

    /// `users`, none of them fenced.
    fn unfenced<const N: usize>(users: [i64; N]) -> [(i64, Option<i64>); N] {
        users.map(|user| (user, None))
    }

    /// A voucher with stock enough for every test's purchases.
    fn in_stock() -> Arc<Voucher> {
        let level = StockLevel {
            stock: 100,
            initial_stock: 100,
            returned: 0,
        };
        Arc::new(Voucher::on_sale(1, level))
    }

    fn users(purchases: &VecDeque<Queued>) -> Vec<i64> {
        purchases.iter().map(|p| p.user_id.get()).collect()
    }

    #[tokio::test]
    async fn a_batch_takes_one_purchase_per_user_in_arrival_order_up_to_its_cap() {
        let gates = Gates::new(Duration::from_secs(1));
        let (mut waiting, _answers) = queued(&gates, unfenced([1, 2, 1, 3, 4, 2, 5])).await;
        let batch = take_batch(&mut waiting, 3);
        let batch: VecDeque<Queued> = batch.into();
        assert_eq!(users(&batch), [1, 2, 3]);
        // The rest wait, in arrival order: the second purchases of users 1
        // and 2 find the first ones' orders in a later batch.
        assert_eq!(users(&waiting), [1, 4, 2, 5]);
        let next: VecDeque<Queued> = take_batch(&mut waiting, 3).into();
        assert_eq!(users(&next), [1, 4, 2]);
        assert_eq!(users(&waiting), [5]);
    }

    #[tokio::test]
    async fn purchases_whose_client_left_are_dropped_before_the_batch() {
        let gates = Gates::new(Duration::from_secs(1));
        let (mut waiting, mut answers) = queued(&gates, unfenced([1, 2, 3])).await;
        // User 2's client left: nobody waits for its answer.
        drop(answers.remove(1));
        let batch: VecDeque<Queued> = take_batch(&mut waiting, 10).into();
        assert_eq!(users(&batch), [1, 3]);
        assert!(waiting.is_empty());
    }

    #[tokio::test]
    async fn each_request_carries_its_purchases_fence_and_drawn_id() {
        let gates = Gates::new(Duration::from_secs(1));
        let (batch, _answers) = queued(&gates, [(1, Some(41)), (2, None), (3, Some(7))]).await;
        let batch = Vec::from(batch);
        let ids = [order(11), order(12), order(13)];
        let at = Utc::now();
        let requests = sale_requests(&batch, &ids, at);
        let carried: Vec<(i64, OrderId, Option<i64>)> = requests
            .iter()
            .map(|r| (r.user_id.get(), r.order_id, r.fence.map(FencingToken::get)))
            .collect();
        assert_eq!(
            carried,
            [
                (1, order(11), Some(41)),
                (2, order(12), None),
                (3, order(13), Some(7)),
            ]
        );
        assert!(requests.iter().all(|r| r.at == at));
    }
}
