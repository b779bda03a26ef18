//! The lock client's command connection: one multiplexed connection that
//! reconnects by itself (redis-rs `ConnectionManager`, or on a cluster its
//! `ClusterConnection`), shared by every lock of the client. A pool
//! checkout would first send a health-check `PING` each time; this sends
//! nothing but the commands.
//!
//! A connection that a failover left on a replica (`READONLY`) or on a
//! master that lost its replicas (`MASTERDOWN`) is open but useless, and
//! `ConnectionManager` only reconnects when a connection breaks, and to the
//! same address: such an answer (and behind Sentinel, any broken
//! connection) drops the connection here, so that the next command connects
//! afresh: through the proxy or managed endpoint, or to the master the
//! sentinels name now.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::FutureExt;
use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, Value};

use super::endpoint::Multiplexed;
use super::LockError;

pub(super) struct Connection {
    client: super::Endpoint,
    timeout: Duration,
    /// Made on first use, so a client can be built while Redis is down;
    /// made again after an answer says it reaches no master.
    current: RwLock<Option<LockConn>>,
    connecting: tokio::sync::Mutex<()>,
}

/// A handle on the shared connection (cheap: the handles multiplex).
#[derive(Clone)]
pub(super) struct LockConn {
    manager: Multiplexed,
    /// Set when this connection answered that it reaches no master (or,
    /// behind Sentinel, when it broke: the master may have moved).
    stale: Arc<AtomicBool>,
    follow_failover: bool,
}

impl Connection {
    pub(super) fn new(client: super::Endpoint, timeout: Duration) -> Self {
        Self {
            client,
            timeout,
            current: RwLock::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) async fn get(&self) -> Result<LockConn, LockError> {
        if let Some(conn) = self.usable() {
            return Ok(conn);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(conn) = self.usable() {
            return Ok(conn);
        }
        let manager = self.client.connect(self.timeout).await?;
        let conn = LockConn {
            manager,
            stale: Arc::new(AtomicBool::new(false)),
            follow_failover: self.client.follows_failover(),
        };
        *self.current.write().expect("connection lock") = Some(conn.clone());
        Ok(conn)
    }

    /// Whether this client talks to a Redis Cluster.
    pub(super) fn is_cluster(&self) -> bool {
        self.client.is_cluster()
    }

    fn usable(&self) -> Option<LockConn> {
        self.current
            .read()
            .expect("connection lock")
            .as_ref()
            .filter(|c| !c.stale.load(Ordering::Relaxed))
            .cloned()
    }
}

impl LockConn {
    /// Marks the connection stale when an answer says it reaches no master.
    /// Server errors arrive as values here; they become errors later.
    fn check<'v>(&self, answer: Result<impl IntoIterator<Item = &'v Value>, &redis::RedisError>) {
        let no_master = match answer {
            Err(error) => {
                matches!(error.kind(), ErrorKind::ReadOnly | ErrorKind::MasterDown)
                    || (self.follow_failover
                        && (error.is_io_error()
                            || error.is_connection_dropped()
                            || error.is_connection_refusal()
                            || error.is_timeout()))
            }
            Ok(values) => values.into_iter().any(reaches_no_master),
        };
        if no_master {
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

impl ConnectionLike for LockConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        async move {
            let answer = self.manager.req_packed_command(cmd).await;
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
            let answer = self.manager.req_packed_commands(cmd, offset, count).await;
            self.check(answer.as_ref());
            answer
        }
        .boxed()
    }

    fn get_db(&self) -> i64 {
        self.manager.get_db()
    }
}
