//! Where a lock client's Redis is: one server (or a proxy, or a managed
//! endpoint), or the master that Redis Sentinel names, looked up again
//! whenever a connection to it has to be made, so that after a failover
//! the client follows the new master.

use std::sync::Arc;

use deadpool_redis::redis::sentinel::{SentinelClient, SentinelServerType};
use deadpool_redis::redis::{self, RedisResult};
use tokio::sync::Mutex;

/// A lock client's Redis.
#[derive(Clone)]
pub enum Endpoint {
    /// One address.
    Server(redis::Client),
    /// The master of `master`, as the sentinels say.
    Sentinel(Arc<Mutex<SentinelClient>>),
}

impl Endpoint {
    /// The master called `master` among the given sentinels (`redis://`
    /// URLs of the sentinels themselves).
    pub fn sentinel(sentinels: Vec<String>, master: &str) -> RedisResult<Self> {
        let client = SentinelClient::build(
            sentinels,
            master.to_owned(),
            None,
            SentinelServerType::Master,
        )?;
        Ok(Self::Sentinel(Arc::new(Mutex::new(client))))
    }

    /// The client of the server to talk to now (for Sentinel, the master
    /// as the sentinels name it at this moment, checked to be one).
    pub(super) async fn client(&self) -> RedisResult<redis::Client> {
        match self {
            Self::Server(client) => Ok(client.clone()),
            Self::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await,
        }
    }

    /// Whether a broken connection should be made again through a new
    /// look-up rather than to the same address.
    pub(super) fn follows_failover(&self) -> bool {
        matches!(self, Self::Sentinel(_))
    }
}

impl From<redis::Client> for Endpoint {
    fn from(client: redis::Client) -> Self {
        Self::Server(client)
    }
}
