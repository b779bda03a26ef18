//! The lock client's command connection: one multiplexed connection that
//! reconnects by itself (redis-rs `ConnectionManager`), shared by every
//! lock of the client. A pool checkout would first send a health-check
//! `PING` each time; this sends nothing but the commands.

use std::time::Duration;

use deadpool_redis::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use deadpool_redis::redis::{self};
use tokio::sync::OnceCell;

use super::LockError;

pub(super) struct Connection {
    client: redis::Client,
    timeout: Duration,
    /// Made on first use, so a client can be built while Redis is down.
    manager: OnceCell<ConnectionManager>,
}

impl Connection {
    pub(super) fn new(client: redis::Client, timeout: Duration) -> Self {
        Self {
            client,
            timeout,
            manager: OnceCell::new(),
        }
    }

    /// A handle on the shared connection (cheap: the handles multiplex).
    pub(super) async fn get(&self) -> Result<ConnectionManager, LockError> {
        let manager = self
            .manager
            .get_or_try_init(|| async {
                // Fail fast while Redis is away: the caller decides whether
                // to resend; the manager reconnects in the background.
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(self.timeout)
                    .set_response_timeout(self.timeout)
                    .set_number_of_retries(1);
                self.client.get_connection_manager_with_config(config).await
            })
            .await?;
        Ok(manager.clone())
    }
}
