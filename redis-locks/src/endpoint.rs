//! Where a lock client's Redis is, how to connect to it, and how script
//! calls are grouped by cluster slot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::RedisResult;

/// A lock client's Redis. The Sentinel master is looked up again for every
/// new connection, so the client follows a failover.
#[derive(Clone)]
pub enum Endpoint {
    /// One address: a server, a proxy or a managed endpoint.
    Server(redis::Client),
    /// The master of a name, as the sentinels say.
    Sentinel(Arc<Sentinels>),
    /// A Redis Cluster, reached through any of its nodes.
    Cluster(Arc<Cluster>),
}

/// The sentinels that name a master. Each is asked in turn, each within
/// its share of the caller's deadline, starting with the last one that
/// answered: one sentinel frozen or black-holed costs the first look-up
/// its share, not every look-up its whole deadline. (redis-rs's own
/// `SentinelClient` asks them one after another on connections with no
/// deadline, so a silent first sentinel kept the others from being asked.)
pub struct Sentinels {
    nodes: Vec<redis::Client>,
    master: String,
    /// The sentinel asked first.
    first: AtomicUsize,
}

/// The shortest time a sentinel is given to answer.
const SENTINEL_AT_LEAST: Duration = Duration::from_millis(100);

impl Sentinels {
    /// The master's address as the first sentinel to answer names it,
    /// within `budget` in all.
    async fn master(&self, budget: Duration) -> RedisResult<redis::Client> {
        let count = self.nodes.len().max(1);
        let share = (budget / u32::try_from(count).unwrap_or(u32::MAX)).max(SENTINEL_AT_LEAST);
        let start = self.first.load(Ordering::Relaxed);
        let mut last_error = None;
        for turn in 0..count {
            let at = (start + turn) % count;
            let asked = tokio::time::timeout(share, self.ask(&self.nodes[at], share)).await;
            match asked {
                Ok(Ok(Some(master))) => {
                    self.first.store(at, Ordering::Relaxed);
                    return Ok(master);
                }
                Ok(Ok(None)) => {
                    last_error = Some(redis::RedisError::from((
                        redis::ErrorKind::MasterNameNotFoundBySentinel,
                        "a sentinel names no master that says it is one",
                        self.master.clone(),
                    )));
                }
                Ok(Err(error)) => last_error = Some(error),
                Err(_) => {
                    last_error = Some(
                        std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("a sentinel did not answer within {share:?}"),
                        )
                        .into(),
                    )
                }
            }
        }
        Err(last_error
            .unwrap_or_else(|| (redis::ErrorKind::EmptySentinelList, "no sentinel to ask").into()))
    }

    /// The master one sentinel names, if the server there says it is one
    /// (`ROLE`): a sentinel cut off from the others, or restarted with an
    /// old view, may name a master since demoted to a replica.
    async fn ask(
        &self,
        sentinel: &redis::Client,
        within: Duration,
    ) -> RedisResult<Option<redis::Client>> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(within)
            .set_response_timeout(within);
        let mut conn = sentinel
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let named: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master)
            .query_async(&mut conn)
            .await?;
        let Some((host, port)) = named else {
            return Ok(None);
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let master = redis::Client::open(format!("redis://{host}:{port}"))?;
        let mut there = master
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut there).await?;
        let says_master = match role.first() {
            Some(redis::Value::BulkString(word)) => word.as_slice() == b"master",
            Some(redis::Value::SimpleString(word)) => word == "master",
            _ => false,
        };
        Ok(says_master.then_some(master))
    }
}

/// A client of each of these `redis://` URLs.
fn clients(urls: &[String]) -> RedisResult<Vec<redis::Client>> {
    urls.iter()
        .map(|url| redis::Client::open(url.as_str()))
        .collect()
}

/// The nodes a cluster is first reached through.
pub struct Cluster {
    urls: Vec<String>,
    nodes: Vec<redis::Client>,
    /// The node the next subscriber connection goes to: a PUBLISH reaches
    /// every node, so any one will do.
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
    /// The master called `master`, as the sentinels at these `redis://` URLs
    /// name it.
    pub fn sentinel(sentinels: Vec<String>, master: &str) -> RedisResult<Self> {
        if sentinels.is_empty() {
            return Err((redis::ErrorKind::EmptySentinelList, "no sentinel given").into());
        }
        Ok(Self::Sentinel(Arc::new(Sentinels {
            nodes: clients(&sentinels)?,
            master: master.to_owned(),
            first: AtomicUsize::new(0),
        })))
    }

    /// A cluster reached through any of these nodes (`redis://` URLs).
    pub fn cluster(urls: Vec<String>) -> RedisResult<Self> {
        let nodes = clients(&urls)?;
        Ok(Self::Cluster(Arc::new(Cluster {
            urls,
            nodes,
            next: AtomicUsize::new(0),
        })))
    }

    /// Opens the command connection, each attempt and answer within `timeout`.
    pub(super) async fn connect(&self, timeout: Duration) -> RedisResult<Multiplexed> {
        if let Self::Cluster(cluster) = self {
            let client = cluster_client(cluster.urls.clone(), timeout)?;
            return Ok(Multiplexed::Cluster(client.get_async_connection().await?));
        }
        // Fail fast while Redis is away: the caller decides whether to resend.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout)
            .set_number_of_retries(1);
        let manager = self
            .subscriber_client(timeout)
            .await?
            .get_connection_manager_with_config(config)
            .await?;
        Ok(Multiplexed::Single(manager))
    }

    /// The server to subscribe on now: the current master (looked up
    /// within `budget`), or a cluster's next node in turn.
    pub(super) async fn subscriber_client(&self, budget: Duration) -> RedisResult<redis::Client> {
        match self {
            Self::Server(client) => Ok(client.clone()),
            Self::Sentinel(sentinels) => sentinels.master(budget).await,
            Self::Cluster(cluster) => {
                let turn = cluster.next.fetch_add(1, Ordering::Relaxed);
                Ok(cluster.nodes[turn % cluster.nodes.len()].clone())
            }
        }
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

/// A Redis Cluster client whose connection attempts and answers each take
/// at most `timeout`, with short retries: the caller's deadline decides how
/// long to keep trying.
pub fn cluster_client(urls: Vec<String>, timeout: Duration) -> RedisResult<ClusterClient> {
    ClusterClientBuilder::new(urls)
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .retries(3)
        .min_retry_wait(20)
        .max_retry_wait(200)
        .build()
}

/// `items` in groups of at most `max`, one script call each; on a cluster,
/// each group's keys in one slot (a script runs on one node).
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

/// The Redis Cluster slot of `key`: CRC-16/XMODEM of its non-empty hash tag
/// (or of the whole key), modulo 16384.
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
