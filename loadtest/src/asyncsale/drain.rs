//! Waiting for the stream writers: until every accepted order is stored,
//! and how long that took.

use std::time::{Duration, Instant};

use crate::api::Admin;

/// Polls the voucher's orders until every one of `answered` is stored (or
/// the timeout passes). `clock` started with the load.
pub(super) async fn stored(
    admin: &Admin,
    voucher: i64,
    answered: &[String],
    clock: Instant,
    timeout_s: u64,
) -> anyhow::Result<Drain> {
    let look = || async move {
        let orders = admin.orders(voucher).await?;
        let ids: std::collections::HashSet<&str> =
            orders.iter().map(|(id, _)| id.as_str()).collect();
        let missing = answered
            .iter()
            .filter(|id| !ids.contains(id.as_str()))
            .count();
        Ok((count(orders.len()), count(missing)))
    };
    wait_stored(clock, timeout_s, Duration::from_millis(200), look).await
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// How the writers caught up with what was accepted.
pub(crate) struct Drain {
    /// Orders stored when the wait ended.
    pub stored: i64,
    /// Accepted orders still unstored when the load ended.
    pub backlog_at_end: i64,
    /// From the load's end until every accepted order was stored.
    pub after_load: Duration,
    /// From the load's start until every accepted order was stored.
    pub until_stored: Duration,
    /// Accepted orders still unstored when the wait gave up.
    pub lost: i64,
}

/// Polls the voucher's stats until `accepted` orders are stored (or the
/// timeout passes). `clock` started with the load.
pub(crate) async fn drain(
    admin: &Admin,
    voucher: i64,
    accepted: u64,
    clock: Instant,
    timeout_s: u64,
) -> anyhow::Result<Drain> {
    let accepted = i64::try_from(accepted).unwrap_or(i64::MAX);
    let look = || async move {
        let stored = admin.stats(voucher).await?.orders;
        Ok((stored, (accepted - stored).max(0)))
    };
    wait_stored(clock, timeout_s, Duration::from_millis(20), look).await
}

/// Asks `look` for (orders stored, accepted orders not stored yet) every
/// `every` until none is missing or `timeout_s` passed. `clock` started
/// with the load, which has just ended.
async fn wait_stored<F, Fut>(
    clock: Instant,
    timeout_s: u64,
    every: Duration,
    mut look: F,
) -> anyhow::Result<Drain>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(i64, i64)>>,
{
    let load_ended = clock.elapsed();
    let deadline = Instant::now() + Duration::from_secs(timeout_s);
    let mut backlog_at_end = None;
    loop {
        let (stored, missing) = look().await?;
        backlog_at_end.get_or_insert(missing);
        if missing == 0 || Instant::now() >= deadline {
            let until_stored = clock.elapsed();
            return Ok(Drain {
                stored,
                backlog_at_end: backlog_at_end.unwrap_or(missing),
                after_load: until_stored.saturating_sub(load_ended),
                until_stored,
                lost: missing,
            });
        }
        tokio::time::sleep(every).await;
    }
}
