//! [`SharedConnection`]: one multiplexed command connection to an
//! [`Endpoint`], shared by every caller, each call under one deadline, and
//! dropped when it reaches no master so that the next call connects afresh.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::FutureExt;
use redis::aio::ConnectionLike;
use redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, RedisResult,
    ScriptInvocation, Value,
};
use tokio::time::Instant;

use super::endpoint::{Endpoint, Multiplexed};

/// One multiplexed connection to an [`Endpoint`], made on first use.
///
/// Every call has one deadline covering connecting, the command and loading
/// a script; a call that gives up drops only its own answer (redis-rs
/// matches answers to callers). An answer of `READONLY` or `MASTERDOWN`, a
/// broken connection, and a timeout, drop the connection:
/// the next call connects afresh. Never send a blocking command (`BLPOP`)
/// or a transaction on it: it is shared.
///
/// ```rust
/// use std::time::Duration;
///
/// use redis_locks::SharedConnection;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = SharedConnection::new(redis::Client::open("redis://127.0.0.1:6379")?, Duration::from_secs(1));
/// let key = format!("redis-locks-doc:{}", uuid::Uuid::new_v4().simple());
/// let incr = redis::cmd("INCR").arg(&key).clone();
/// let (a, b): (redis::RedisResult<i64>, redis::RedisResult<i64>) =
///     tokio::join!(redis.query(&incr), redis.query(&incr)); // one socket
/// assert_eq!(a? + b?, 3);
/// # redis.query::<()>(redis::cmd("DEL").arg(&key)).await?;
/// # Ok(())
/// # }
/// ```
pub struct SharedConnection {
    endpoint: Endpoint,
    timeout: Duration,
    /// Made on first use, so a client can be built while Redis is down.
    current: RwLock<Option<Handle>>,
    connecting: tokio::sync::Mutex<()>,
}

/// A handle on the shared connection (cheap: the handles multiplex).
#[derive(Clone)]
pub(crate) struct Handle {
    conn: Multiplexed,
    /// Set when the connection is found useless: the next call replaces it.
    stale: Arc<AtomicBool>,
}

impl SharedConnection {
    /// A connection to `endpoint` whose calls end within `timeout`.
    pub fn new(endpoint: impl Into<Endpoint>, timeout: Duration) -> Self {
        Self {
            endpoint: endpoint.into(),
            timeout,
            current: RwLock::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// The deadline every call gets unless given its own.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.endpoint.is_cluster()
    }

    /// Whether a connection is open and not found broken.
    pub fn is_open(&self) -> bool {
        self.usable().is_some()
    }

    /// Runs one command within the connection's timeout.
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        self.query_within(self.timeout, cmd).await
    }

    /// Runs one command within `timeout`.
    pub async fn query_within<T: FromRedisValue>(
        &self,
        timeout: Duration,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        let deadline = Instant::now() + timeout;
        // Boxed, to keep callers' futures small (deep call chains otherwise
        // hit the compiler's type-layout limits).
        Box::pin(async move {
            let mut handle = self.handle_by(deadline).await?;
            let answer = tokio::time::timeout_at(deadline, cmd.query_async(&mut handle)).await;
            settle(&handle, deadline, answer)
        })
        .await
    }

    /// Runs a Lua script (loaded on `NOSCRIPT`) within the timeout.
    pub async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        self.invoke_by(Instant::now() + self.timeout, invocation)
            .await
    }

    /// Runs a Lua script, ending by `deadline`.
    pub async fn invoke_by<T: FromRedisValue>(
        &self,
        deadline: Instant,
        invocation: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        // Boxed, as in `query_within`.
        Box::pin(async move {
            let mut handle = self.handle_by(deadline).await?;
            let answer =
                tokio::time::timeout_at(deadline, invocation.invoke_async(&mut handle)).await;
            settle(&handle, deadline, answer)
        })
        .await
    }

    /// The connection, connecting first if needed, by `deadline`.
    async fn handle_by(&self, deadline: Instant) -> RedisResult<Handle> {
        match tokio::time::timeout_at(deadline, self.handle()).await {
            Ok(handle) => handle,
            Err(_) => Err(timed_out(deadline)),
        }
    }

    /// The connection, made now if none is usable (one attempt at a time).
    pub(crate) async fn handle(&self) -> RedisResult<Handle> {
        if let Some(handle) = self.usable() {
            return Ok(handle);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(handle) = self.usable() {
            return Ok(handle);
        }
        let conn = self.endpoint.connect(self.timeout).await?;
        let handle = Handle {
            conn,
            stale: Arc::new(AtomicBool::new(false)),
        };
        *self.current.write().expect("connection lock") = Some(handle.clone());
        Ok(handle)
    }

    fn usable(&self) -> Option<Handle> {
        self.current
            .read()
            .expect("connection lock")
            .as_ref()
            .filter(|c| !c.stale.load(Ordering::Relaxed))
            .cloned()
    }
}

/// A call's answer, or its timeout. Silence may be a master that is gone
/// (frozen, or cut off without a reset, with a replica promoted behind the
/// same address or found by Sentinel), or a path that lost the bytes sent
/// (after which the answers that do come would be out of step): the
/// connection is made again, which costs one connect against a socket the
/// kernel could keep for a quarter of an hour.
fn settle<T>(
    handle: &Handle,
    deadline: Instant,
    answer: Result<RedisResult<T>, tokio::time::error::Elapsed>,
) -> RedisResult<T> {
    answer.unwrap_or_else(|_| {
        if !handle.is_cluster() {
            handle.stale.store(true, Ordering::Relaxed);
        }
        Err(timed_out(deadline))
    })
}

/// An I/O timeout, so that `is_timeout()` says so.
fn timed_out(deadline: Instant) -> RedisError {
    let late = Instant::now().saturating_duration_since(deadline);
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("Redis did not answer by the call's deadline ({late:?} ago)"),
    )
    .into()
}

impl Handle {
    /// A cluster's connection follows failed nodes by itself, and one slow
    /// shard must not cost every node's socket and the slot map: a timeout
    /// does not drop it.
    fn is_cluster(&self) -> bool {
        matches!(self.conn, Multiplexed::Cluster(_))
    }

    /// Marks the connection stale when it broke or an answer says it
    /// reaches no master (server errors are still values here).
    fn check<'v>(&self, answer: Result<impl IntoIterator<Item = &'v Value>, &RedisError>) {
        let useless = match answer {
            Err(error) => {
                matches!(error.kind(), ErrorKind::ReadOnly | ErrorKind::MasterDown)
                    // Connect afresh rather than read redis-rs's reconnection,
                    // which may have failed while the server was down.
                    || error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_connection_refusal()
                    || (error.is_timeout() && !self.is_cluster())
            }
            Ok(values) => values.into_iter().any(reaches_no_master),
        };
        if useless {
            self.stale.store(true, Ordering::Relaxed);
        }
    }
}

/// Whether an answer is (or holds) `READONLY` or `MASTERDOWN`.
pub(crate) fn reaches_no_master(value: &Value) -> bool {
    match value {
        Value::ServerError(error) => matches!(error.code(), "READONLY" | "MASTERDOWN"),
        Value::Array(items) => items.iter().any(reaches_no_master),
        _ => false,
    }
}

impl ConnectionLike for Handle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        async move {
            let answer = self.conn.connection().req_packed_command(cmd).await;
            self.check(answer.as_ref().map(std::iter::once));
            answer
        }
        .boxed()
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        async move {
            let answer = self
                .conn
                .connection()
                .req_packed_commands(cmd, offset, count)
                .await;
            self.check(answer.as_ref());
            answer
        }
        .boxed()
    }

    fn get_db(&self) -> i64 {
        self.conn.db()
    }
}
