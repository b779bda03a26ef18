//! Redis for the service's own commands (order ids, sold-out flags, the
//! lab's plain locks): a connection pool whose every call has a deadline.
//!
//! A call that outlives its deadline answers [`KvError::TimedOut`] and its
//! connection leaves the pool instead of going back to it: whatever the
//! server does with the late command, no later call reads its answer. So
//! does a connection that answers `READONLY` or `MASTERDOWN` (a failover
//! left it on a replica): the next call connects afresh, through the proxy
//! or managed endpoint, to whichever server is master now.

use std::time::Duration;

use deadpool_redis::redis::{self, Cmd, FromRedisValue, ScriptInvocation};
use deadpool_redis::{Connection, Pool, PoolError, Status};

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
            K::BusyLoadingError | K::TryAgain | K::ClusterDown | K::MasterDown | K::ReadOnly
        )
}

/// An answer, after which a connection that reaches no master leaves the
/// pool.
fn settle<T>(conn: Connection, answer: redis::RedisResult<T>) -> Result<T, KvError> {
    if let Err(error) = &answer {
        if matches!(
            error.kind(),
            redis::ErrorKind::ReadOnly | redis::ErrorKind::MasterDown
        ) {
            drop(Connection::take(conn));
        }
    }
    Ok(answer?)
}

/// A Redis pool whose calls each end within `timeout`. Cheap to clone.
#[derive(Clone)]
pub struct Kv {
    pool: Pool,
    timeout: Duration,
}

impl Kv {
    pub fn new(pool: Pool, timeout: Duration) -> Self {
        Self { pool, timeout }
    }

    /// Runs one command (or a `MULTI`-less pipeline's worth, via `Cmd`).
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, KvError> {
        let mut conn = self.connection().await?;
        match tokio::time::timeout(self.timeout, cmd.query_async(&mut conn)).await {
            Ok(answer) => settle(conn, answer),
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
            Ok(answer) => settle(conn, answer),
            Err(_) => Err(self.abandon(conn)),
        }
    }

    pub fn status(&self) -> Status {
        self.pool.status()
    }

    async fn connection(&self) -> Result<Connection, KvError> {
        // The pool's own wait and create timeouts bound this too; the outer
        // one also covers its health-check PING on a frozen server.
        match tokio::time::timeout(self.timeout, self.pool.get()).await {
            Ok(conn) => Ok(conn?),
            Err(_) => Err(KvError::TimedOut(self.timeout)),
        }
    }

    /// Drops a connection whose command is still out, so that its late
    /// answer cannot reach the next caller.
    fn abandon(&self, conn: Connection) -> KvError {
        drop(Connection::take(conn));
        KvError::TimedOut(self.timeout)
    }
}
