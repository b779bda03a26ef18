//! Purchases in flight on this instance, by user and voucher: a second
//! request of a user for a voucher while the first is under way is refused
//! at once, before it takes a place at the gate or asks for a lock, so one
//! token's hundred connections hold one place, not a hundred. (Across
//! instances the user's lock still decides.)

use crate::domain::{UserId, VoucherId};
use std::collections::HashSet;
use std::sync::Mutex;

/// Independent sets, so that purchases of different users rarely meet on
/// one mutex.
const SHARDS: usize = 64;

pub struct InFlight {
    shards: [Mutex<HashSet<(UserId, VoucherId)>>; SHARDS],
}

/// A purchase's mark: it leaves the set when the purchase ends (answered,
/// or dropped because its client went away).
pub struct Mark<'a> {
    set: &'a InFlight,
    key: (UserId, VoucherId),
}

impl Default for InFlight {
    fn default() -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::default()),
        }
    }
}

impl InFlight {
    /// Marks `user_id`'s purchase of `voucher_id`; `None` when one is in
    /// flight already.
    pub fn enter(&self, user_id: UserId, voucher_id: VoucherId) -> Option<Mark<'_>> {
        let key = (user_id, voucher_id);
        let fresh = self
            .shard(key)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key);
        fresh.then_some(Mark { set: self, key })
    }

    fn shard(
        &self,
        (user_id, voucher_id): (UserId, VoucherId),
    ) -> &Mutex<HashSet<(UserId, VoucherId)>> {
        let mixed =
            (user_id.get() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (voucher_id.get() as u64);
        &self.shards[(mixed % SHARDS as u64) as usize]
    }
}

impl Drop for Mark<'_> {
    fn drop(&mut self) {
        self.set
            .shard(self.key)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::InFlight;
    use crate::domain::{UserId, VoucherId};

    #[test]
    fn one_purchase_per_user_and_voucher_at_a_time() {
        let set = InFlight::default();
        let first = set
            .enter(UserId::new(7).unwrap(), VoucherId::new(1).unwrap())
            .expect("the first is in");
        assert!(
            set.enter(UserId::new(7).unwrap(), VoucherId::new(1).unwrap())
                .is_none(),
            "a duplicate is refused"
        );
        // Another voucher of the same user, another user of the voucher.
        let other_voucher = set
            .enter(UserId::new(7).unwrap(), VoucherId::new(2).unwrap())
            .expect("another voucher");
        let other_user = set
            .enter(UserId::new(8).unwrap(), VoucherId::new(1).unwrap())
            .expect("another user");
        drop(first);
        assert!(
            set.enter(UserId::new(7).unwrap(), VoucherId::new(1).unwrap())
                .is_some(),
            "free again once it ended"
        );
        drop((other_voucher, other_user));
    }
}
