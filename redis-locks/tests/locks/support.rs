//! What the lock tests share: a lock client under a key prefix of its own
//! whose keys go when it drops, a way to unwrap a hold that must exist, and
//! one to run an owner in a task of its own.

use std::fmt::Display;
use std::future::Future;
use std::ops::Deref;
use std::time::Duration;

use redis_locks::{LockClient, LockError, LockOptions, Owner};
pub use testkit::{command_calls, redis_conn, redis_url, OwnRedis};
use tokio::task::JoinHandle;

/// The lease of holds that must outlive the test.
pub const LEASE: Duration = Duration::from_secs(10);

/// The short watchdog lease of the watchdog tests: renewed every 500 ms,
/// so a busy machine has a second of slack.
pub const SHORT_WATCHDOG_LEASE: Duration = Duration::from_millis(1500);

/// A lock client on the local Redis under a fresh key prefix; every key
/// under that prefix is deleted when it drops, whatever the test did.
pub struct TestLocks {
    client: LockClient,
    url: String,
    prefix: String,
}

impl TestLocks {
    /// With the default options.
    pub fn new() -> Self {
        Self::on(&redis_url(), None)
    }

    /// With a watchdog lease of [`SHORT_WATCHDOG_LEASE`], so that tests see
    /// several renewals.
    pub fn with_watchdog() -> Self {
        Self::on(&redis_url(), Some(SHORT_WATCHDOG_LEASE))
    }

    /// On the Redis at `url`, with this watchdog lease if given.
    pub fn on(url: &str, watchdog_lease: Option<Duration>) -> Self {
        let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
        Self {
            client: client_on(url, &prefix, watchdog_lease),
            url: url.to_owned(),
            prefix,
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Another client (another process, as far as the locks can tell) under
    /// the same prefix.
    pub fn another_client(&self) -> LockClient {
        client_on(&self.url, &self.prefix, None)
    }

    /// Spawns `task` as the owner `id`, on a clone of `lock`: a waiter (or a
    /// holder) in a task of its own.
    pub fn spawn_as<L, F, T>(
        &self,
        id: impl Display,
        lock: &L,
        task: impl FnOnce(L, Owner) -> F,
    ) -> JoinHandle<T>
    where
        L: Clone,
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        tokio::spawn(task(lock.clone(), self.owner(id)))
    }
}

impl Deref for TestLocks {
    type Target = LockClient;

    fn deref(&self) -> &LockClient {
        &self.client
    }
}

impl Drop for TestLocks {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(self.url.as_str()) else {
            return;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut conn);
        }
    }
}

/// A lock client on `url` under `prefix`, with a watchdog lease if given.
pub fn client_on(url: &str, prefix: &str, watchdog_lease: Option<Duration>) -> LockClient {
    let mut options = LockOptions::default();
    if let Some(lease) = watchdog_lease {
        options.watchdog_lease = lease;
    }
    let client = redis::Client::open(url).expect("a Redis URL");
    LockClient::with_options(client, prefix, options)
}

/// The hold an attempt must have got.
#[track_caller]
pub fn held<T>(attempt: Result<Option<T>, LockError>, why: &str) -> T {
    match attempt {
        Ok(Some(hold)) => hold,
        Ok(None) => panic!("no hold: {why}"),
        Err(e) => panic!("{e}: {why}"),
    }
}

/// An attempt that must have been refused (the lock held elsewhere).
#[track_caller]
pub fn refused<T>(attempt: Result<Option<T>, LockError>, why: &str) {
    match attempt {
        Ok(None) => {}
        Ok(Some(_)) => panic!("not refused: {why}"),
        Err(e) => panic!("{e}: {why}"),
    }
}

/// The lease left to `key` in the shared Redis, in ms (-1: none, -2: no
/// such key).
pub async fn pttl(key: &str) -> i64 {
    let mut conn = redis_conn(&redis_url()).await;
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Deletes `key` behind the lock library's back, as an operator or an
/// eviction would.
pub async fn delete_behind_its_back(url: &str, key: &str) {
    let mut conn = redis_conn(url).await;
    redis::cmd("DEL")
        .arg(key)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
}
