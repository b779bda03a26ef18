//! [`SharedConnection`]: one multiplexed command connection to an
//! [`Endpoint`], shared by every caller, each call under one deadline, and
//! dropped when it reaches no master.
//!
//! Multiplexed: commands from many tasks go out on one socket and redis-rs
//! matches each answer to the call that sent it (its own per-call channel,
//! in send order). A call that gives up at its deadline drops its end of
//! that channel; its answer, when it comes, is read and thrown away, so a
//! late answer never reaches another caller. Nothing is checked out, so no
//! health-check `PING` precedes a command: the connection sends only the
//! callers' commands. It cannot carry a blocking command (`BLPOP`,
//! `XREADGROUP ... BLOCK`) or a transaction: the first would stall every
//! caller behind it, the second would interleave with them.
//!
//! One deadline per call covers everything: waiting for the connection to be
//! made (one attempt at a time, callers behind it wait), the command and, for
//! [`SharedConnection::invoke`], loading a script Redis does not know yet.
//! A call never takes longer than its deadline, whatever a proxy in front of
//! Redis does with a new connection (accept it and hold it, say, while no
//! server behind it is up).
//!
//! A connection that a failover left on a replica (`READONLY`) or on a
//! master that lost its replicas (`MASTERDOWN`) is open but useless, and
//! redis-rs's `ConnectionManager` only reconnects when a connection breaks,
//! and to the same address: such an answer (also nested in an array), a
//! broken connection, and behind Sentinel a call that timed out, drop the
//! connection here, so that the next call connects afresh: through the
//! proxy or managed endpoint, or to the master the sentinels name now. (A
//! broken connection is made again by the next call, not by redis-rs in
//! the background: the first call after a Redis restart succeeds.)

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

/// One multiplexed connection to an [`Endpoint`], made on first use and
/// again after it reaches no master, every call within its deadline.
///
/// # Example
///
/// ```rust
/// use std::time::Duration;
///
/// use redis_locks::SharedConnection;
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let redis = SharedConnection::new(client, Duration::from_secs(1));
/// let key = format!("redis-locks-doc:{}", uuid::Uuid::new_v4().simple());
///
/// // Clones of one command run at once on one socket; each gets its answer.
/// let incr = redis::cmd("INCR").arg(&key).clone();
/// let (a, b): (redis::RedisResult<i64>, redis::RedisResult<i64>) =
///     tokio::join!(redis.query(&incr), redis.query(&incr));
/// let mut counts = [a?, b?];
/// counts.sort();
/// assert_eq!(counts, [1, 2]);
///
/// // A call that outlives its deadline is a timeout error. (BLPOP blocks
/// // the shared connection for 0.2 s: never send such a command here.)
/// let slow = redis::cmd("BLPOP").arg(format!("{key}:empty")).arg(0.2).clone();
/// let gave_up = redis
///     .query_within::<Option<Vec<String>>>(Duration::from_millis(50), &slow)
///     .await
///     .unwrap_err();
/// assert!(gave_up.is_timeout());
/// // Its late answer (nil) is thrown away: the next call reads its own.
/// let value: i64 = redis.query(redis::cmd("GET").arg(&key)).await?;
/// assert_eq!(value, 2);
/// # redis.query::<()>(redis::cmd("DEL").arg(&key)).await?;
/// # Ok(())
/// # }
/// ```
pub struct SharedConnection {
    endpoint: Endpoint,
    timeout: Duration,
    /// Made on first use, so a client can be built while Redis is down;
    /// made again after an answer says it reaches no master.
    current: RwLock<Option<Handle>>,
    connecting: tokio::sync::Mutex<()>,
}

/// A handle on the shared connection (cheap: the handles multiplex).
#[derive(Clone)]
pub(crate) struct Handle {
    conn: Multiplexed,
    /// Set when this connection answered that it reaches no master (or,
    /// behind Sentinel, when it broke or timed out: the master may have
    /// moved).
    stale: Arc<AtomicBool>,
    follow_failover: bool,
}

impl SharedConnection {
    /// A connection to `endpoint` (made on first use) whose calls each end
    /// within `timeout` unless told otherwise.
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

    /// Whether this is a Redis Cluster (a script's keys must then share a
    /// slot).
    pub fn is_cluster(&self) -> bool {
        self.endpoint.is_cluster()
    }

    /// Whether a connection is open now (or, at least, not yet found
    /// broken).
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
        // Boxed: callers' futures hold a pointer, not redis-rs's nested
        // futures, so that deep call chains stay within the compiler's
        // type-layout limits.
        Box::pin(async move {
            let mut handle = self.handle_by(deadline).await?;
            let answer = tokio::time::timeout_at(deadline, cmd.query_async(&mut handle)).await;
            settle(&handle, deadline, answer)
        })
        .await
    }

    /// Runs a Lua script (`EVALSHA`, loading it on `NOSCRIPT`) within the
    /// connection's timeout.
    pub async fn invoke<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        self.invoke_by(Instant::now() + self.timeout, invocation)
            .await
    }

    /// Runs a Lua script, ending by `deadline` (for callers that resend
    /// within one deadline of their own).
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

    /// The connection, made now if there is none usable (one attempt at a
    /// time; the others wait for it).
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
            follow_failover: self.endpoint.follows_failover(),
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

/// A call's answer, or its timeout; behind Sentinel, silence may be a
/// master that is gone, and the connection is made again.
fn settle<T>(
    handle: &Handle,
    deadline: Instant,
    answer: Result<RedisResult<T>, tokio::time::error::Elapsed>,
) -> RedisResult<T> {
    answer.unwrap_or_else(|_| {
        if handle.follow_failover {
            handle.stale.store(true, Ordering::Relaxed);
        }
        Err(timed_out(deadline))
    })
}

/// The error of a call that reached its deadline: an I/O timeout, so that
/// `is_timeout()` says so.
fn timed_out(deadline: Instant) -> RedisError {
    let late = Instant::now().saturating_duration_since(deadline);
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("Redis did not answer by the call's deadline ({late:?} ago)"),
    )
    .into()
}

impl Handle {
    /// Marks the connection stale when it broke or an answer says it
    /// reaches no master. Server errors arrive as values here; they become
    /// errors later.
    fn check<'v>(&self, answer: Result<impl IntoIterator<Item = &'v Value>, &RedisError>) {
        let useless = match answer {
            Err(error) => {
                matches!(error.kind(), ErrorKind::ReadOnly | ErrorKind::MasterDown)
                    // Broken: connect afresh on the next call rather than
                    // wait on redis-rs's reconnection, whose failed attempt
                    // (made while the server was down) the first call after
                    // a restart would read.
                    || error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_connection_refusal()
                    || (self.follow_failover && error.is_timeout())
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
