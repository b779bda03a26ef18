//! Redis for the service's own commands (order ids, sold-out flags, the
//! async sale's scripts and streams, the lab's plain locks), on the lock
//! library's connection layer: one multiplexed connection
//! ([`redis_locks::SharedConnection`]) whose every call has a deadline.
//!
//! One layer for both, so one place holds the failover rules: a call that
//! outlives its deadline answers a timeout, and its late answer is thrown
//! away, never read by the next call; a connection that answers `READONLY`
//! or `MASTERDOWN` (a failover left it on a replica), or that broke or
//! timed out (a master frozen or cut off behind it), is dropped, and the next call connects
//! afresh, through the proxy or managed endpoint, or to whichever server
//! the sentinels name master now. On a Redis Cluster the connection routes
//! each command to its key's master and follows `MOVED` and `ASK` by itself.
//! Nothing is checked out of a pool, so no `PING` precedes a command.
//!
//! No command here blocks on the server (stream reads poll, without
//! `BLOCK`), and none needs a connection of its own (no `WATCH`/`MULTI`).

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, FromRedisValue, ScriptInvocation};
use redis_locks::{Endpoint, SharedConnection};

mod keys;
mod stream;
pub use keys::{AsyncSaleKeys, Keys, RoomKeys};
pub use stream::{Consumer, ConsumerState, Delivery};

/// Redis failed a call, or did not answer within its deadline (a timeout
/// error: `is_timeout()`).
#[derive(Debug, thiserror::Error)]
#[error("Redis failed a command")]
pub struct KvError(#[from] pub redis::RedisError);

impl KvError {
    /// The error code of Redis's answer (`BUSYGROUP`, `NOGROUP`, ...), if
    /// Redis answered with an error.
    pub fn code(&self) -> Option<&str> {
        self.0.code()
    }

    /// Whether Redis is away, slow or between masters, so that the same
    /// call may succeed later (the service answers 503), rather than a bug.
    pub fn is_transient(&self) -> bool {
        is_transient(&self.0)
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
        // Refusals of a Redis that is full (`maxmemory` with `noeviction`),
        // cannot persist, runs a long script, or lacks the replicas it
        // wants: they pass, and none is the caller's fault.
        || matches!(
            error.code(),
            Some("OOM" | "MISCONF" | "BUSY" | "NOREPLICAS" | "LOADING")
        )
        // The same said in a generic `ERR`: a Redis at `maxclients`, and a
        // script refused for memory or on a replica by Redis 6, which wraps
        // the refusal in "Error running script".
        || (error.code() == Some("ERR")
            && error.detail().is_some_and(|detail| {
                ["max number of clients reached", "-OOM ", "-READONLY ", "-MISCONF ", "-NOREPLICAS "]
                    .iter()
                    .any(|said| detail.contains(said))
            }))
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

/// A `REDIS_URL` that names no Redis.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{url:?}: {problem}")]
pub struct BadRedisUrl {
    url: String,
    problem: &'static str,
}

impl RedisTarget {
    pub fn parse(url: &str) -> Result<Self, BadRedisUrl> {
        let url = url.trim();
        let bad = |problem| BadRedisUrl {
            url: url.to_owned(),
            problem,
        };
        let nodes = |list: &str| -> Result<Vec<String>, BadRedisUrl> {
            let nodes: Vec<String> = list
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if nodes.is_empty() {
                return Err(bad("names no host:port"));
            }
            Ok(nodes)
        };
        if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            let (list, master) = rest
                .split_once('/')
                .filter(|(_, m)| !m.is_empty() && !m.contains('/'))
                .ok_or_else(|| {
                    bad("expected redis+sentinel://host:port[,host:port...]/<master-name>")
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

impl RedisTarget {
    /// The endpoint this target names, for a [`SharedConnection`] or a
    /// lock client.
    pub fn endpoint(self) -> redis::RedisResult<Endpoint> {
        Ok(match self {
            Self::Server(url) => redis::Client::open(url)?.into(),
            Self::Sentinel { sentinels, master } => Endpoint::sentinel(sentinels, &master)?,
            Self::Cluster { nodes } => Endpoint::cluster(nodes)?,
        })
    }
}

/// The service's Redis: one shared connection whose calls each end within
/// its timeout. Cheap to clone.
#[derive(Clone)]
pub struct Kv {
    conn: Arc<SharedConnection>,
}

impl Kv {
    /// Redis at `endpoint` (connected on first use), every call within
    /// `timeout`.
    pub fn new(endpoint: impl Into<Endpoint>, timeout: Duration) -> Self {
        Self {
            conn: Arc::new(SharedConnection::new(endpoint, timeout)),
        }
    }

    /// Whether this is a Redis Cluster (a script's keys must then share a
    /// slot).
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    /// The deadline of every call.
    pub fn timeout(&self) -> Duration {
        self.conn.timeout()
    }

    /// Runs one command.
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, KvError> {
        Ok(self.conn.query(cmd).await?)
    }

    /// Runs a Lua script (EVALSHA, loading it on NOSCRIPT).
    pub async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, KvError> {
        Ok(self.conn.invoke(invocation).await?)
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
                return Err(KvError(redis::RedisError::from((
                    redis::ErrorKind::ClusterDown,
                    "the cluster does not serve every slot",
                ))));
            }
        }
        Ok(())
    }

    /// Connections open now: 1 or 0 (one multiplexed connection carries
    /// every call).
    pub fn open_connections(&self) -> usize {
        usize::from(self.conn.is_open())
    }
}

#[cfg(test)]
mod tests {
    use super::{is_transient, RedisTarget};

    /// The error Redis answers with `line` (a RESP error line).
    fn answered(line: &str) -> redis::RedisError {
        redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .and_then(redis::Value::extract_error)
            .unwrap_err()
    }

    #[test]
    fn a_full_busy_or_unpersisting_redis_is_transient_and_a_script_bug_is_not() {
        for line in [
            "OOM command not allowed when used memory > 'maxmemory'.",
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
            "BUSY Redis is busy running a script.",
            "NOREPLICAS Not enough good replicas to write.",
            "LOADING Redis is loading the dataset in memory",
            "READONLY You can't write against a read only replica.",
            "ERR max number of clients reached",
            "ERR Error running script (call to f_0123): @user_script:5: @user_script: 5: -OOM command not allowed when used memory > 'maxmemory'. ",
            "ERR Error running script (call to f_0123): @user_script:5: @user_script: 5: -READONLY You can't write against a read only replica. ",
        ] {
            assert!(is_transient(&answered(line)), "{line}");
        }
        for line in [
            "ERR Error running script: attempt to compare nil with number",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "NOSCRIPT No matching script.",
        ] {
            assert!(!is_transient(&answered(line)), "{line}");
        }
    }

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
