//! Redis for the service's own commands (order ids, sold-out flags, the
//! lab's plain locks): a connection pool whose every call has a deadline.
//!
//! A call that outlives its deadline answers [`KvError::TimedOut`] and its
//! connection leaves the pool instead of going back to it: whatever the
//! server does with the late command, no later call reads its answer. So
//! does a connection that answers `READONLY` or `MASTERDOWN` (a failover
//! left it on a replica): the next call connects afresh, through the proxy
//! or managed endpoint, to whichever server is master now.
//!
//! On a Redis Cluster there is no pool: one multiplexed cluster connection
//! routes each command to its key's master and follows `MOVED` and `ASK`
//! by itself; a late answer on it cannot reach another caller, so nothing
//! needs dropping.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::aio::ConnectionLike;
use deadpool_redis::redis::cluster::ClusterClient;
use deadpool_redis::redis::cluster_async::ClusterConnection;
use deadpool_redis::redis::{
    self, Cmd, FromRedisValue, Pipeline, RedisFuture, ScriptInvocation, Value,
};
use deadpool_redis::{sentinel, Connection, Pool, PoolError};

mod stream;
pub use stream::{Consumer, ConsumerState, Delivery};

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("no Redis connection: {0}")]
    Pool(#[from] PoolError),
    #[error("Redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("Redis did not answer within {0:?}")]
    TimedOut(Duration),
}

impl KvError {
    /// The error code of Redis's answer (`BUSYGROUP`, `NOGROUP`, ...), if
    /// Redis answered with an error.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Redis(error) | Self::Pool(PoolError::Backend(error)) => error.code(),
            _ => None,
        }
    }

    /// Whether Redis is away, slow or between masters, so that the same
    /// call may succeed later (the service answers 503), rather than a bug.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::TimedOut(_) => true,
            Self::Pool(PoolError::Backend(e)) | Self::Redis(e) => is_transient(e),
            // No connection within the wait time, or none can be made.
            Self::Pool(_) => true,
        }
    }
}

/// Whether a Redis error passes once Redis is back (or has a master again).
pub fn is_transient(error: &redis::RedisError) -> bool {
    use redis::ErrorKind as K;
    error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_timeout()
        || matches!(
            error.kind(),
            K::BusyLoadingError
                | K::TryAgain
                | K::ClusterDown
                | K::MasterDown
                | K::ReadOnly
                // A cluster in the middle of a resharding or a failover.
                | K::Moved
                | K::Ask
                | K::ClusterConnectionNotFound
                // Between a master's death and its replica's promotion.
                | K::MasterNameNotFoundBySentinel
                | K::NoValidReplicasFoundBySentinel
        )
}

/// Where the service's Redis is, as `REDIS_URL` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// `redis://host:port` (or `rediss://`, `unix://`): one Redis, or a
    /// proxy or managed endpoint in front of several.
    Server(String),
    /// `redis+sentinel://host:port[,host:port...]/<master-name>`: the
    /// master the sentinels name (as `redis://` URLs of the sentinels).
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
    /// `redis+cluster://host:port[,host:port...]`.
    Cluster { nodes: Vec<String> },
}

impl RedisTarget {
    pub fn parse(url: &str) -> Result<Self, String> {
        let url = url.trim();
        let nodes = |list: &str| -> Result<Vec<String>, String> {
            let nodes: Vec<String> = list
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if nodes.is_empty() {
                return Err(format!("{url:?} names no host:port"));
            }
            Ok(nodes)
        };
        if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            let (list, master) = rest
                .split_once('/')
                .filter(|(_, m)| !m.is_empty() && !m.contains('/'))
                .ok_or_else(|| {
                    format!(
                        "{url:?}: expected redis+sentinel://host:port[,host:port...]/<master-name>"
                    )
                })?;
            return Ok(Self::Sentinel {
                sentinels: nodes(list)?,
                master: master.to_owned(),
            });
        }
        if let Some(rest) = url.strip_prefix("redis+cluster://") {
            return Ok(Self::Cluster {
                nodes: nodes(rest.trim_end_matches('/'))?,
            });
        }
        Ok(Self::Server(url.to_owned()))
    }
}

/// A pooled connection to one Redis or to the Sentinel master, or a
/// handle on the cluster connection.
enum Pooled {
    Server(Connection),
    Sentinel(sentinel::Connection),
    Cluster(ClusterConnection),
}

impl Pooled {
    /// Takes the connection out of its pool: it is closed, not reused.
    fn discard(self) {
        match self {
            Self::Server(conn) => drop(Connection::take(conn)),
            Self::Sentinel(conn) => drop(sentinel::Connection::take(conn)),
            // Multiplexed: answers are matched to their callers.
            Self::Cluster(_) => {}
        }
    }
}

impl ConnectionLike for Pooled {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(conn) => conn.req_packed_command(cmd),
            Self::Sentinel(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Sentinel(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(conn) => conn.get_db(),
            Self::Sentinel(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

/// The pool behind a [`Kv`].
#[derive(Clone)]
pub enum Pools {
    Server(Pool),
    /// Each new connection asks the sentinels for the master.
    Sentinel(sentinel::Pool),
    /// One cluster connection, made on first use (the service starts while
    /// the cluster is down) and shared.
    Cluster {
        client: Arc<ClusterClient>,
        conn: Arc<tokio::sync::Mutex<Option<ClusterConnection>>>,
    },
}

/// A Redis pool whose calls each end within `timeout`. Cheap to clone.
#[derive(Clone)]
pub struct Kv {
    pool: Pools,
    timeout: Duration,
    /// Behind Sentinel a broken connection may mean the master moved: it is
    /// dropped, and the next one asks the sentinels again.
    follow_failover: bool,
}

impl Kv {
    pub fn new(pool: Pool, timeout: Duration) -> Self {
        Self {
            pool: Pools::Server(pool),
            timeout,
            follow_failover: false,
        }
    }

    /// A pool of connections to the master the sentinels name.
    pub fn sentinel(pool: sentinel::Pool, timeout: Duration) -> Self {
        Self {
            pool: Pools::Sentinel(pool),
            timeout,
            follow_failover: true,
        }
    }

    /// The cluster that `client` reaches, one connection for all calls.
    pub fn cluster(client: ClusterClient, timeout: Duration) -> Self {
        Self {
            pool: Pools::Cluster {
                client: Arc::new(client),
                conn: Arc::default(),
            },
            timeout,
            follow_failover: false,
        }
    }

    /// Whether this is a Redis Cluster (a script's keys must then share a
    /// slot).
    pub fn is_cluster(&self) -> bool {
        matches!(self.pool, Pools::Cluster { .. })
    }

    /// Runs one command (or a `MULTI`-less pipeline's worth, via `Cmd`).
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, KvError> {
        let mut conn = self.connection().await?;
        match tokio::time::timeout(self.timeout, cmd.query_async(&mut conn)).await {
            Ok(answer) => self.settle(conn, answer),
            Err(_) => Err(self.abandon(conn)),
        }
    }

    /// Runs a Lua script (EVALSHA, loading it on NOSCRIPT).
    pub async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, KvError> {
        let mut conn = self.connection().await?;
        match tokio::time::timeout(self.timeout, invocation.invoke_async(&mut conn)).await {
            Ok(answer) => self.settle(conn, answer),
            Err(_) => Err(self.abandon(conn)),
        }
    }

    /// Whether Redis takes writes now: `key` is written with a short life
    /// (a replica or a master without its replicas refuses), and a cluster
    /// must also say its state is `ok` (every slot served).
    pub async fn check_writable(&self, key: &str) -> Result<(), KvError> {
        let mut write = redis::cmd("SET");
        write.arg(key).arg(1).arg("PX").arg(10_000);
        self.query::<()>(&write).await?;
        if self.is_cluster() {
            let info: String = self.query(redis::cmd("CLUSTER").arg("INFO")).await?;
            if !info.lines().any(|line| line.trim() == "cluster_state:ok") {
                return Err(KvError::Redis(redis::RedisError::from((
                    redis::ErrorKind::ClusterDown,
                    "the cluster does not serve every slot",
                ))));
            }
        }
        Ok(())
    }

    /// Connections open and idle now (a cluster's one shared connection
    /// counts as open and idle).
    pub fn usage(&self) -> (usize, usize) {
        let status = match &self.pool {
            Pools::Server(pool) => pool.status(),
            Pools::Sentinel(pool) => pool.status(),
            Pools::Cluster { conn, .. } => {
                let open = conn.try_lock().map_or(1, |c| usize::from(c.is_some()));
                return (open, open);
            }
        };
        (status.size, status.available)
    }

    async fn connection(&self) -> Result<Pooled, KvError> {
        // The pool's own wait and create timeouts bound this too; the outer
        // one also covers its health-check PING on a frozen server.
        let get = async {
            Ok::<_, KvError>(match &self.pool {
                Pools::Server(pool) => Pooled::Server(pool.get().await?),
                Pools::Sentinel(pool) => Pooled::Sentinel(pool.get().await?),
                Pools::Cluster { client, conn } => {
                    let mut conn = conn.lock().await;
                    if conn.is_none() {
                        *conn = Some(client.get_async_connection().await?);
                    }
                    Pooled::Cluster(conn.clone().expect("just connected"))
                }
            })
        };
        match tokio::time::timeout(self.timeout, get).await {
            Ok(conn) => Ok(conn?),
            Err(_) => Err(KvError::TimedOut(self.timeout)),
        }
    }

    /// Drops a connection whose command is still out, so that its late
    /// answer cannot reach the next caller.
    fn abandon(&self, conn: Pooled) -> KvError {
        conn.discard();
        KvError::TimedOut(self.timeout)
    }

    /// An answer, after which a connection that reaches no master (or,
    /// behind Sentinel, broke) leaves the pool.
    fn settle<T>(&self, conn: Pooled, answer: redis::RedisResult<T>) -> Result<T, KvError> {
        if let Err(error) = &answer {
            let no_master = matches!(
                error.kind(),
                redis::ErrorKind::ReadOnly | redis::ErrorKind::MasterDown
            );
            let broke = error.is_io_error()
                || error.is_connection_dropped()
                || error.is_connection_refusal();
            if no_master || (self.follow_failover && broke) {
                conn.discard();
            }
        }
        Ok(answer?)
    }
}

#[cfg(test)]
mod tests {
    use super::RedisTarget;

    #[test]
    fn redis_urls_name_a_server_the_sentinels_or_a_cluster() {
        assert_eq!(
            RedisTarget::parse("redis://127.0.0.1:6379"),
            Ok(RedisTarget::Server("redis://127.0.0.1:6379".into()))
        );
        assert_eq!(
            RedisTarget::parse("redis+sentinel://a:26379,b:26380/mymaster"),
            Ok(RedisTarget::Sentinel {
                sentinels: vec!["redis://a:26379".into(), "redis://b:26380".into()],
                master: "mymaster".into()
            })
        );
        assert_eq!(
            RedisTarget::parse("redis+cluster://a:7000,b:7001"),
            Ok(RedisTarget::Cluster {
                nodes: vec!["redis://a:7000".into(), "redis://b:7001".into()]
            })
        );
        for bad in [
            "redis+sentinel://a:1",
            "redis+sentinel://a:1/",
            "redis+sentinel:///m",
            "redis+cluster://",
        ] {
            assert!(RedisTarget::parse(bad).is_err(), "{bad:?}");
        }
    }
}
