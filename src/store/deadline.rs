//! The deadline every query runs under: a frozen or stuck Postgres costs a
//! request at most this long, then the store reports it unavailable.

use std::future::Future;
use std::time::Duration;

use super::StoreError;

/// `.within(timeout)` on any sqlx future: its answer, or
/// [`StoreError::TimedOut`] once `timeout` has passed. The connection of a
/// query cut short is checked before the pool lends it again (see
/// `Store::connect`), so its late answer reaches nobody.
pub(super) trait Within<T>: Future<Output = Result<T, sqlx::Error>> + Sized {
    async fn within(self, timeout: Duration) -> Result<T, StoreError> {
        match tokio::time::timeout(timeout, self).await {
            Ok(answer) => answer.map_err(StoreError::from),
            Err(_) => Err(StoreError::TimedOut(timeout)),
        }
    }
}

impl<T, F: Future<Output = Result<T, sqlx::Error>>> Within<T> for F {}
