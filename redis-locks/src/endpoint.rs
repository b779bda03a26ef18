//! Where a lock client's Redis is: one server (or a proxy, or a managed
//! endpoint); the master that Redis Sentinel names, looked up again
//! whenever a connection to it has to be made, so that after a failover
//! the client follows the new master; or a Redis Cluster, whose client
//! follows `MOVED` and `ASK` and learns the new slot owners by itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::RedisResult;
use tokio::sync::Mutex;

/// A lock client's Redis.
#[derive(Clone)]
pub enum Endpoint {
    /// One address.
    Server(redis::Client),
    /// The master of `master`, as the sentinels say.
    Sentinel(Arc<Mutex<SentinelClient>>),
    /// A Redis Cluster, reached through any of its nodes.
    Cluster(Arc<Cluster>),
}

/// The nodes a cluster is first reached through.
pub struct Cluster {
    urls: Vec<String>,
    nodes: Vec<redis::Client>,
    /// The node the next subscriber connection goes to: a classic PUBLISH
    /// reaches every node of a cluster, so any one will do, and a lost
    /// connection moves on to the next.
    next: AtomicUsize,
}

/// The one multiplexed command connection of a lock client.
#[derive(Clone)]
pub(super) enum Multiplexed {
    /// To one server (or the Sentinel master), reconnecting by itself.
    Single(ConnectionManager),
    /// To every master of a cluster, each command routed by its key's slot.
    Cluster(ClusterConnection),
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

    /// A cluster reached through these nodes (`redis://` URLs; one is
    /// enough, more survive that one being down).
    pub fn cluster(urls: Vec<String>) -> RedisResult<Self> {
        let nodes = urls
            .iter()
            .map(|url| redis::Client::open(url.as_str()))
            .collect::<RedisResult<Vec<_>>>()?;
        Ok(Self::Cluster(Arc::new(Cluster {
            urls,
            nodes,
            next: AtomicUsize::new(0),
        })))
    }

    /// Opens the command connection; every attempt and every answer
    /// within `timeout`.
    pub(super) async fn connect(&self, timeout: Duration) -> RedisResult<Multiplexed> {
        if let Self::Cluster(cluster) = self {
            let client = cluster_client(cluster.urls.clone(), timeout)?;
            return Ok(Multiplexed::Cluster(client.get_async_connection().await?));
        }
        // Fail fast while Redis is away: the caller decides whether to
        // resend; the manager reconnects in the background.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout)
            .set_number_of_retries(1);
        let manager = self
            .subscriber_client()
            .await?
            .get_connection_manager_with_config(config)
            .await?;
        Ok(Multiplexed::Single(manager))
    }

    /// The client of the server to subscribe on now (for Sentinel, the
    /// master as the sentinels name it at this moment; for a cluster, the
    /// next of its nodes in turn).
    pub(super) async fn subscriber_client(&self) -> RedisResult<redis::Client> {
        match self {
            Self::Server(client) => Ok(client.clone()),
            Self::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await,
            Self::Cluster(cluster) => {
                let turn = cluster.next.fetch_add(1, Ordering::Relaxed);
                Ok(cluster.nodes[turn % cluster.nodes.len()].clone())
            }
        }
    }

    /// Whether a broken connection should be made again through a new
    /// look-up rather than to the same address.
    pub(super) fn follows_failover(&self) -> bool {
        matches!(self, Self::Sentinel(_))
    }

    /// Whether the keys of one script call must share a cluster slot.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }
}

impl From<redis::Client> for Endpoint {
    fn from(client: redis::Client) -> Self {
        Self::Server(client)
    }
}

impl Multiplexed {
    /// The connection to send on, whichever kind it is.
    pub(super) fn connection(&mut self) -> &mut (dyn ConnectionLike + Send) {
        match self {
            Self::Single(conn) => conn,
            Self::Cluster(conn) => conn,
        }
    }

    /// The database the connection's commands go to.
    pub(super) fn db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

/// A Redis Cluster client through these nodes whose every connection
/// attempt and answer takes at most `timeout`, and which follows a
/// redirection or refreshes its slot map a few times rather than backing
/// off for long: the caller's deadline decides how long to keep trying.
pub fn cluster_client(urls: Vec<String>, timeout: Duration) -> RedisResult<ClusterClient> {
    ClusterClientBuilder::new(urls)
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .retries(3)
        .min_retry_wait(20)
        .max_retry_wait(200)
        .build()
}

/// `items` in groups for one script call each, at most `max` to a group;
/// on a cluster, each group's keys (`key` of each item) in one slot, since
/// a script may only touch keys of the node it runs on.
pub(super) fn script_batches<'a, T>(
    cluster: bool,
    items: impl IntoIterator<Item = &'a T>,
    key: impl Fn(&T) -> &str,
    max: usize,
) -> Vec<Vec<&'a T>> {
    let groups: Vec<Vec<&T>> = if cluster {
        let mut by_slot: std::collections::HashMap<u16, Vec<&T>> = Default::default();
        for item in items {
            by_slot
                .entry(slot(key(item).as_bytes()))
                .or_default()
                .push(item);
        }
        by_slot.into_values().collect()
    } else {
        vec![items.into_iter().collect()]
    };
    groups
        .iter()
        .flat_map(|group| group.chunks(max.max(1)).map(<[&T]>::to_vec))
        .filter(|group| !group.is_empty())
        .collect()
}

/// The Redis Cluster slot of `key`: CRC-16/XMODEM of its hash tag (the
/// part between the first `{` and the next `}`, when not empty) or of the
/// whole key, modulo 16384.
pub(super) fn slot(key: &[u8]) -> u16 {
    const CRC16: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    CRC16.checksum(tagged.unwrap_or(key)) % 16384
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_follow_the_hash_tag_as_redis_computes_them() {
        // Values from CLUSTER KEYSLOT on a Redis 7 server.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"{user1000}.followers"), slot(b"user1000"));
        // An empty tag is no tag: the whole key is hashed.
        assert_eq!(slot(b"foo{}{bar}"), 8363);
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"p:lock:{order:7:42}:fence"), slot(b"order:7:42"));
    }
}
