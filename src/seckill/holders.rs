//! Who holds a live order, in memory on every instance: a purchase by a
//! user who holds one for the voucher is answered `already_purchased`
//! before the in-flight check, the gate, the user's lock or any Redis or
//! Postgres work (a botnet of accounts that bought once and asks again
//! costs a lookup per request).
//!
//! Filled by this instance's own purchases as they are answered, and by
//! every instance's through the order events (`order_events`, read every
//! 250 ms from the feed's place at start-up); an order cancelled or
//! expired is forgotten here at once (and its creation, should a read of
//! the feed that began before the close bring it afterwards, is not taken
//! back, nor is the order of a batch that read it live before the close
//! committed), and on every other instance at its next read. Not knowing is safe: a user missing here takes the purchase's
//! usual path, which finds the order. Knowing wrongly is bounded: an order
//! closed on another instance is still held here for at most one read.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::domain::{OrderId, UserId, VoucherId};
use crate::store::{Closed, HolderChange, Store};

/// How often the order events are read.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);
/// Most changes read at once (more are read at once after them).
const PAGE: i64 = 5_000;
/// Most holders kept; past it the least used are forgotten (and take the
/// usual path again).
const CAPACITY: u64 = 2_000_000;
/// How long a holder is kept: a live order of long ago takes the usual
/// path again (and is kept again from there).
const KEPT: Duration = Duration::from_secs(3_600);

/// How long an order known closed (closed here, or read closed from the
/// feed) is remembered as closed: a read of the feed that began before the
/// close may bring its creation after it, and a batch that read the order
/// live before the close committed may answer after it; neither must make
/// it live again.
const CLOSED_KEPT: Duration = Duration::from_secs(60);

/// The live orders this instance knows of, by voucher and user.
pub(super) struct Holders {
    live: moka::sync::Cache<(VoucherId, UserId), OrderId>,
    /// Orders known closed lately (see [`CLOSED_KEPT`]).
    closed: moka::sync::Cache<OrderId, ()>,
}

impl Holders {
    pub(super) fn new() -> Self {
        Self {
            live: moka::sync::Cache::builder()
                .max_capacity(CAPACITY)
                .time_to_live(KEPT)
                .build(),
            closed: moka::sync::Cache::builder()
                .max_capacity(CAPACITY / 10)
                .time_to_live(CLOSED_KEPT)
                .build(),
        }
    }

    /// The live order `user` holds for `voucher_id`, if known here.
    pub(super) fn holder(&self, voucher_id: VoucherId, user: UserId) -> Option<OrderId> {
        self.live.get(&(voucher_id, user))
    }

    /// `order_id` of `user` for `voucher_id` is live, unless it is known
    /// closed (whoever says it is live read it before its close).
    pub(super) fn hold(&self, voucher_id: VoucherId, user: UserId, order_id: OrderId) {
        if !self.closed.contains_key(&order_id) {
            self.live.insert((voucher_id, user), order_id);
        }
    }

    /// `order_id` is closed (cancelled or expired): forgotten, unless the
    /// user holds a newer one.
    fn let_go(&self, voucher_id: VoucherId, user: UserId, order_id: OrderId) {
        if self.live.get(&(voucher_id, user)) == Some(order_id) {
            self.live.invalidate(&(voucher_id, user));
        }
    }

    /// Orders this instance closed.
    pub(super) fn closed(&self, closed: &[Closed]) {
        for order in closed {
            self.closed.insert(order.order_id, ());
            self.let_go(order.voucher_id, order.user_id, order.order_id);
        }
    }

    /// A change read from the feed. Most created orders are known already
    /// (this instance sold them, or read them before): a lookup, not a
    /// second insert, which costs the cache a write and its upkeep.
    fn apply(&self, change: &HolderChange) {
        let (voucher_id, user, order_id) = (change.voucher_id, change.user_id, change.order_id);
        if change.closed {
            self.closed.insert(order_id, ());
            self.let_go(voucher_id, user, order_id);
        } else if self.holder(voucher_id, user) != Some(order_id) {
            self.hold(voucher_id, user, order_id);
        }
    }
}

/// Reads every instance's order changes into `holders` until `stop`.
pub(super) async fn follow(store: Store, holders: Arc<Holders>, stop: CancellationToken) {
    let mut after = None;
    let mut failing = false;
    loop {
        let read = match after {
            None => store.feed_now().await.map(|now| after = Some(now)),
            Some(from) => read_changes(&store, &holders, from)
                .await
                .map(|to| after = Some(to)),
        };
        match read {
            Ok(()) => failing = false,
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "reading the order events for the holders failed; retrying");
            }
            Err(_) => {}
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(FOLLOW_EVERY) => {}
        }
    }
}

/// Applies every change after `from`; where the feed was read to.
async fn read_changes(
    store: &Store,
    holders: &Holders,
    mut from: crate::domain::EventId,
) -> crate::store::Result<crate::domain::EventId> {
    loop {
        let changes = store.holder_changes(from, PAGE).await?;
        for change in &changes {
            holders.apply(change);
        }
        match changes.last() {
            Some(last) => from = last.at,
            None => return Ok(from),
        }
        if (changes.len() as i64) < PAGE {
            return Ok(from);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(voucher: i64, user: i64, order: i64) -> (VoucherId, UserId, OrderId) {
        (
            VoucherId::new(voucher).unwrap(),
            UserId::new(user).unwrap(),
            OrderId::from_stored(order).unwrap(),
        )
    }

    #[test]
    fn a_closed_order_is_forgotten_but_not_a_newer_one_of_the_same_user() {
        let holders = Holders::new();
        let (v, u, first) = ids(1, 7, 100);
        let (_, _, second) = ids(1, 7, 101);
        holders.hold(v, u, first);
        assert_eq!(holders.holder(v, u), Some(first));
        // The user cancelled the first and bought again here before the
        // first's cancel was read from the feed.
        holders.hold(v, u, second);
        holders.let_go(v, u, first);
        assert_eq!(holders.holder(v, u), Some(second));
        holders.let_go(v, u, second);
        assert_eq!(holders.holder(v, u), None);
        assert_eq!(holders.holder(VoucherId::new(2).unwrap(), u), None);
    }

    #[test]
    fn an_order_closed_here_stays_closed_when_the_feed_brings_its_creation_after() {
        let holders = Holders::new();
        let (v, u, order) = ids(1, 7, 100);
        holders.hold(v, u, order);
        let now = chrono::Utc::now();
        holders.closed(&[Closed {
            order_id: order,
            voucher_id: v,
            user_id: u,
            pay_by: now,
            quantity: 1,
            level: crate::domain::StockLevel {
                stock: 1,
                initial_stock: 1,
                returned: 1,
            },
            sale_mode: crate::domain::SaleMode::Async,
            end_time: now,
        }]);
        assert_eq!(holders.holder(v, u), None);
        // A read of the feed that began before the cancel committed: the
        // creation, without the cancel.
        holders.apply(&HolderChange {
            at: crate::domain::EventId::default(),
            order_id: order,
            user_id: u,
            voucher_id: v,
            closed: false,
        });
        assert_eq!(holders.holder(v, u), None);
    }

    #[test]
    fn the_feed_adds_what_is_new_and_closes_what_it_says() {
        let holders = Holders::new();
        let (v, u, first) = ids(1, 7, 100);
        let (_, _, second) = ids(1, 7, 101);
        let change = |order_id, closed| HolderChange {
            at: crate::domain::EventId::default(),
            order_id,
            user_id: u,
            voucher_id: v,
            closed,
        };
        holders.apply(&change(first, false));
        assert_eq!(holders.holder(v, u), Some(first));
        // Read again (this instance sold it, then read its event).
        holders.apply(&change(first, false));
        assert_eq!(holders.holder(v, u), Some(first));
        // A newer order of the user replaces the one known.
        holders.apply(&change(second, false));
        assert_eq!(holders.holder(v, u), Some(second));
        // The first's close, read late, leaves the newer one held.
        holders.apply(&change(first, true));
        assert_eq!(holders.holder(v, u), Some(second));
        holders.apply(&change(second, true));
        assert_eq!(holders.holder(v, u), None);
    }

    #[test]
    fn an_order_read_closed_from_the_feed_is_not_held_again_by_a_batch_that_read_it_live() {
        let holders = Holders::new();
        let (v, u, order) = ids(1, 7, 100);
        // Cancelled on another instance; this one reads the cancel before
        // a batch that saw the order live (its snapshot was taken before
        // the cancel committed) answers `already_purchased` with it.
        holders.apply(&HolderChange {
            at: crate::domain::EventId::default(),
            order_id: order,
            user_id: u,
            voucher_id: v,
            closed: true,
        });
        holders.hold(v, u, order);
        assert_eq!(holders.holder(v, u), None);
    }
}
