//! The sale's gate: a purchase whose units are all spoken for by earlier
//! purchases of this instance waits for their outcome before it takes its
//! lock, and learns "sold out" here rather than from a lock and a batch.
//! It counts units, not purchases: a purchase of 3 speaks for 3.
//!
//! A crowd's first wave, the requests that pass the sold-out flag before
//! the sale is known to be over, would otherwise each take a lock (a Redis
//! round trip each way) only to be told "sold out" by the batch. With the
//! gate, no more units are asked for at once than there are left as far
//! as this instance knows; the rest wait for those to be answered.
//!
//! The gate never refuses what might still be sold. It only waits, and only
//! while the purchases it let through cover every unit known to be left;
//! it answers "sold out" only to a purchase that waited, when the purchases
//! it waited for left no unit at the voucher's epoch (stock grows only
//! with the epoch, see `soldout`). A purchase that did not wait goes on
//! whatever the gate remembers: what it remembers may be old (a unit given
//! back through another instance starts a new epoch, which this instance
//! sees only when it reads the voucher again), and the sold-out flag
//! already spoke for the sale's state. What the gate knows of the units
//! left may be high (other instances sell too), which only makes it let
//! more through. A purchase never waits longer than `wait_limit`; then it
//! goes on as if there were no gate.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::metric;
use crate::domain::{Quantity, StockLevel, Voucher, VoucherId};

/// The gates of every voucher this instance sells.
pub(super) struct Gates {
    gates: moka::sync::Cache<VoucherId, Arc<Gate>>,
    wait_limit: Duration,
}

/// What the gate says to a purchase.
pub(super) enum Admission {
    /// Go on to the lock and the batch, holding the purchase's place
    /// until its batch answers (or it gives up).
    Go(Place),
    /// No unit is left at the voucher's epoch.
    SoldOut,
}

/// A purchase let through the gate and not answered yet, with the units
/// it asks for.
pub(super) struct Place {
    gate: Arc<Gate>,
    units: i64,
}

#[derive(Default)]
struct Gate {
    state: Mutex<State>,
    /// Told when a purchase leaves (answered or given up).
    left_one: Notify,
}

#[derive(Default)]
struct State {
    /// The newest stock this instance has seen: the epoch, and the units
    /// left at it.
    stock: Option<(i64, i64)>,
    /// Units asked for by the purchases let through and not answered yet.
    ahead: i64,
}

/// What the gate decides now.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Go,
    Wait,
    SoldOut,
}

impl Gate {
    /// The gate's state; a panic while it was held left it whole (every
    /// change to it is one assignment).
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lets one more purchase, of `units`, through, counted in `state`
    /// (this gate's).
    fn enter(self: &Arc<Self>, state: &mut State, units: i64) -> Place {
        state.ahead += units;
        Place {
            gate: self.clone(),
            units,
        }
    }
}

impl State {
    /// Keeps the newest of what it knew and `(epoch, units)`: a newer
    /// epoch replaces, the same epoch can only have fewer units left.
    fn saw(&mut self, epoch: i64, units: i64) {
        self.stock = match self.stock {
            Some((known, left)) if known > epoch => Some((known, left)),
            Some((known, left)) if known == epoch => Some((known, left.min(units))),
            _ => Some((epoch, units)),
        };
    }

    /// The verdict on a purchase of `units` of the voucher at `epoch` that
    /// has `waited` here for those ahead of it. One that asks for more
    /// than is left, with nobody ahead, goes on: the batch tells it how
    /// many are left.
    fn verdict(&self, epoch: i64, units: i64, waited: bool) -> Verdict {
        match self.stock {
            // Newer than the purchase's view of the voucher: not the state
            // its flag spoke for, so no verdict on it.
            Some((known, _)) if known != epoch => Verdict::Go,
            // Learned while it waited: those it waited for took the rest.
            Some((_, left)) if left <= 0 && waited => Verdict::SoldOut,
            Some((_, left)) if left > 0 && self.ahead > 0 && self.ahead + units > left => {
                Verdict::Wait
            }
            _ => Verdict::Go,
        }
    }
}

impl Gates {
    pub(super) fn new(wait_limit: Duration) -> Self {
        Self {
            gates: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_idle(Duration::from_secs(600))
                .build(),
            wait_limit,
        }
    }

    fn gate(&self, voucher_id: VoucherId) -> Arc<Gate> {
        self.gates.get_with(voucher_id, Arc::default)
    }

    /// Lets a purchase of `quantity` units of `voucher` (as this instance
    /// last read it) through when they may be left for it, after the
    /// purchases ahead of it were answered if they spoke for the units.
    pub(super) async fn admit(&self, voucher: &Voucher, quantity: Quantity) -> Admission {
        let gate = self.gate(voucher.id);
        let units = i64::from(quantity.get());
        let epoch = voucher.level.epoch();
        let give_up = tokio::time::Instant::now() + self.wait_limit;
        let mut waited = false;
        loop {
            let left_one = gate.left_one.notified();
            tokio::pin!(left_one);
            // Registered before the state is read: a purchase that leaves
            // in between still wakes this one.
            left_one.as_mut().enable();
            {
                let mut state = gate.state();
                state.saw(epoch, i64::from(voucher.level.stock));
                match state.verdict(epoch, units, waited) {
                    Verdict::SoldOut => return Admission::SoldOut,
                    Verdict::Go => return Admission::Go(gate.enter(&mut state, units)),
                    Verdict::Wait => {}
                }
            }
            if !waited {
                waited = true;
                metrics::counter!(metric::GATE_WAITS).increment(1);
            }
            if tokio::time::timeout_at(give_up, left_one).await.is_err() {
                // Those ahead take long (a slow Postgres): go on as if
                // there were no gate; the batch decides.
                return Admission::Go(gate.enter(&mut gate.state(), units));
            }
        }
    }

    /// Tells the gate what a committed batch left: called before the
    /// batch's purchases are answered, so that those waiting for them see
    /// it when they wake.
    pub(super) fn saw(&self, voucher_id: VoucherId, level: StockLevel) {
        self.gate(voucher_id)
            .state()
            .saw(level.epoch(), i64::from(level.stock));
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.gate.state().ahead -= self.units;
        self.gate.left_one.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(stock: Option<(i64, i64)>, ahead: i64) -> State {
        State { stock, ahead }
    }

    /// Units known left as (epoch, units), units asked ahead, the
    /// purchase's epoch, its units, whether it waited; and the verdict.
    type Case = (Option<(i64, i64)>, i64, i64, i64, bool, Verdict);

    const CASES: &[Case] = &[
        // Fewer units ahead than left: go; as many: wait.
        (Some((100, 3)), 2, 100, 1, false, Verdict::Go),
        (Some((100, 3)), 3, 100, 1, false, Verdict::Wait),
        (Some((100, 3)), 3, 100, 1, true, Verdict::Wait),
        (None, 1_000, 100, 1, false, Verdict::Go),
        // Units, not purchases: 2 ahead and 2 asked of 3 left waits; 1
        // ahead and 2 asked goes.
        (Some((100, 3)), 2, 100, 2, false, Verdict::Wait),
        (Some((100, 3)), 1, 100, 2, false, Verdict::Go),
        // Nobody ahead: one asking for more than is left goes on, to hear
        // from the batch how many are left.
        (Some((100, 2)), 0, 100, 3, false, Verdict::Go),
        // Sold out only to one that waited while the last units went.
        (Some((100, 0)), 0, 100, 1, true, Verdict::SoldOut),
        // One that did not wait goes on: what the gate remembers may be
        // older than the flag it has just passed.
        (Some((100, 0)), 0, 100, 1, false, Verdict::Go),
        // A return or a restock since (a newer epoch than the one seen
        // here) reopens; a newer state than the purchase's view is no
        // verdict on it.
        (Some((100, 0)), 0, 101, 1, true, Verdict::Go),
        (Some((101, 0)), 5, 100, 1, true, Verdict::Go),
    ];

    #[test]
    fn purchases_wait_while_the_units_ahead_cover_what_is_left_and_only_waiters_hear_sold_out() {
        for (stock, ahead, epoch, units, waited, expected) in CASES {
            assert_eq!(
                &state(*stock, *ahead).verdict(*epoch, *units, *waited),
                expected,
                "{stock:?}, {ahead} ahead, epoch {epoch}, {units} asked, waited {waited}"
            );
        }
    }

    #[test]
    fn the_newest_epoch_wins_and_units_only_fall_within_one() {
        let mut s = state(None, 0);
        s.saw(100, 40);
        s.saw(100, 55); // an older read of the same epoch
        assert_eq!(s.stock, Some((100, 40)));
        s.saw(101, 41); // a unit given back
        assert_eq!(s.stock, Some((101, 41)));
        s.saw(100, 0); // a late answer about the older epoch
        assert_eq!(s.stock, Some((101, 41)));
    }
}
