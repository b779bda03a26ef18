//! [`GuardCore`], what the guards of the single-server locks share: how a
//! hold stays alive, how its holder hears that it ended, and giving it back
//! by `unlock` or, when dropped, in the background.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::Shared;
use super::watchdog::{Registration, Renewal, Watchdog};
use super::{LockError, Owner};

/// A hold's lease as asked for, resolved as its request goes out.
#[derive(Debug, Clone, Copy)]
pub(super) struct Term {
    pub(super) lease: Duration,
    pub(super) watched: bool,
    /// A fixed lease is counted from here: it errs early, never late.
    pub(super) sent: Instant,
}

/// How a hold stays alive, and how its holder learns that it ended.
enum Life {
    /// Renewed by the watchdog, which says when it finds the hold gone.
    Watched(Registration),
    /// A fixed lease ending then.
    Until(Instant),
}

impl Life {
    fn is_lost(&self) -> bool {
        match self {
            Self::Watched(watch) => *watch.lost.borrow(),
            Self::Until(expires) => Instant::now() >= *expires,
        }
    }

    async fn lost(&self) {
        match self {
            Self::Watched(watch) => {
                let mut heard = watch.lost.clone();
                // An error: the watchdog is gone, so the lock will be lost.
                let _ = heard.wait_for(|lost| *lost).await;
            }
            Self::Until(expires) => tokio::time::sleep_until((*expires).into()).await,
        }
    }

    /// The hold is being released: stop renewing it.
    fn end(&self, watchdog: &Watchdog) {
        if let Self::Watched(watch) = self {
            watchdog.unwatch(watch.id);
        }
    }
}

/// What a [`GuardCore`] needs of the lock it holds.
pub(super) trait GuardedLock: Clone + Send + 'static {
    /// The client the lock belongs to.
    fn shared(&self) -> &Arc<Shared>;
    /// The key of the lock's hash.
    fn hash_key(&self) -> &Arc<str>;
}

/// One hold of a single-server lock, whatever its kind.
pub(super) struct GuardCore<L> {
    pub(super) lock: L,
    pub(super) owner: Owner,
    pub(super) lease: Duration,
    life: Life,
    armed: bool,
}

impl<L: GuardedLock> GuardCore<L> {
    /// A hold just granted, watched (renewed as `renewal` says) if its term
    /// asks so.
    pub(super) fn granted(
        lock: L,
        owner: &Owner,
        term: Term,
        renewal: impl FnOnce() -> Renewal,
    ) -> Self {
        let life = if term.watched {
            let watchdog = &lock.shared().watchdog;
            Life::Watched(watchdog.watch(
                lock.hash_key().clone(),
                owner.clone(),
                renewal(),
                term.sent,
            ))
        } else {
            Life::Until(super::lock::later(term.sent, term.lease))
        };
        Self {
            lock,
            owner: owner.clone(),
            lease: term.lease,
            life,
            armed: true,
        }
    }

    /// A guard's `Debug`, begun with the fields every guard shows.
    pub(super) fn debug<'a, 'b>(
        &self,
        f: &'a mut fmt::Formatter<'b>,
        guard: &str,
    ) -> fmt::DebugStruct<'a, 'b> {
        let mut debug = f.debug_struct(guard);
        debug
            .field("key", self.lock.hash_key())
            .field("owner", &self.owner);
        debug
    }

    pub(super) fn is_lost(&self) -> bool {
        self.life.is_lost()
    }

    pub(super) async fn lost(&self) {
        self.life.lost().await;
    }

    /// Disarms the guard and stops renewing the hold; lends what giving it
    /// back takes.
    pub(super) fn give_back(&mut self) -> (&L, &Owner, Duration) {
        self.armed = false;
        self.life.end(&self.lock.shared().watchdog);
        (&self.lock, &self.owner, self.lease)
    }

    /// For a guard's `Drop`: unless already given back, gives the hold back
    /// in the background by `release`.
    pub(super) fn release_on_drop<F, Fut>(&mut self, release: F)
    where
        F: FnOnce(L, Owner, Duration) -> Fut,
        Fut: Future<Output = Result<(), LockError>> + Send + 'static,
    {
        if !self.armed {
            return;
        }
        let (lock, owner, lease) = self.give_back();
        let releasing = release(lock.clone(), owner.clone(), lease);
        lock.shared()
            .release_in_background(lock.hash_key().clone(), owner.clone(), releasing);
    }
}
