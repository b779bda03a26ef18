//! Test support shared by the workspace's tests and its load driver: where
//! the local Postgres and Redis are, the admin API's client (`admin`), free
//! loopback ports, the service as a process of its own (`service`), private
//! `redis-server` processes to restart or freeze, key clean-up, the shop's
//! side of JWTs and webhooks (`shop`), the shipped nginx front (`front`),
//! the guide's runnable blocks (`guide`), and one balance check of a
//! voucher's books in SQL (`books`).
//!
//! It depends on no crate of the workspace, so the lock library's tests and
//! the service's use the same servers without the lock library depending on
//! the service.

mod admin;
pub mod books;
mod front;
pub mod guide;
pub mod ha;
pub mod jwt;
mod receiver;
mod service;
mod shop;

pub use admin::{AdminApi, LabStats, NewSale, OrderLine, SaleMode, Stats};
pub use books::Books;
pub use front::Front;
pub use receiver::{acknowledged, Answering, Delivery, Receiver};
pub use service::{drop_database, drop_database_on, ServiceProcess};
pub use shop::{rsa_key, webhook_signed};

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The Redis the tests use: `REDIS_URL`, by default the local one.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// `host:port` of [`redis_url`], for a proxy in front of it.
pub fn redis_addr() -> String {
    redis_addr_of(&redis_url())
}

/// `host:port` of a Redis URL (user, password and database left out).
pub fn redis_addr_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host = rest.split('/').next().unwrap_or(rest);
    host.rsplit('@').next().unwrap_or(host).to_owned()
}

/// The Postgres server the tests use (`DATABASE_URL` without its database
/// name and query), so that each test can make a database of its own.
pub fn pg_server() -> String {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/seckill".into());
    let without_query = url.split('?').next().unwrap_or(&url).to_owned();
    match without_query.rsplit_once('/') {
        Some((server, _db)) if server.contains("//") && !server.ends_with('/') => server.to_owned(),
        _ => without_query,
    }
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A connection to the Redis at `url`, for a test's own commands.
pub async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("Redis answers")
}

/// Calls of one command a Redis server has served (`INFO commandstats`).
pub async fn command_calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    commandstats(&info).get(command).copied().unwrap_or(0)
}

/// Calls per command name, from the `cmdstat_<name>:calls=<n>,...` lines
/// of `INFO commandstats`.
pub fn commandstats(info: &str) -> std::collections::BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = fields.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// Deletes every key under `prefix` (SCAN, so a large Redis is not blocked);
/// a Redis that does not answer is left as it is.
pub async fn delete_keys(url: &str, prefix: &str) {
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let mut cursor: u64 = 0;
    loop {
        let Ok((next, keys)): redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
        else {
            return;
        };
        if !keys.is_empty() {
            let _: redis::RedisResult<()> =
                redis::cmd("DEL").arg(keys).query_async(&mut conn).await;
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
}

/// Debian's Chromium, headless, with its profile in `profile` and none of
/// its own traffic (first run, background networking, component updates,
/// sync): the start of every test that loads a page in a browser. The
/// caller adds what it loads and how (`--dump-dom`, `--screenshot=...`,
/// host rules, a virtual time budget).
pub fn headless_chromium(profile: &Path) -> Command {
    let binary = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("chromium is installed (scripts/deps.sh installs it)");
    let mut chromium = Command::new(binary);
    chromium
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()));
    chromium
}

/// A `redis-server` of the caller's own on a free loopback port, without
/// persistence, working in a temporary directory; stopped (thawed first if
/// frozen) and its directory removed when dropped.
pub struct OwnRedis {
    pub port: u16,
    child: Option<Child>,
    extra: Vec<String>,
    /// Its working directory: a master writes its replication snapshot
    /// there, not in the project.
    dir: PathBuf,
}

impl OwnRedis {
    /// A server, or a panic saying why none started (for tests).
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server started with these extra arguments (`--replicaof`, ...).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::try_start_with(extra).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// A server, or why none started (for callers that report errors).
    pub fn try_start_with(extra: &[&str]) -> anyhow::Result<Self> {
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let port = free_port().context("no free port")?;
        let dir = std::env::temp_dir().join(format!(
            "testkit-redis-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
        let mut redis = Self {
            port,
            child: None,
            extra: extra.iter().map(|a| (*a).to_owned()).collect(),
            dir,
        };
        // A port found free may be taken before the server binds it: then
        // another one.
        let mut tries = 0;
        while let Err(error) = redis.try_restart() {
            tries += 1;
            if tries == 5 {
                return Err(error);
            }
            redis.port = free_port().context("no free port")?;
        }
        Ok(redis)
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// (Re)starts the server on the same port and waits until it answers;
    /// a port held for a moment by someone else is waited for (bounded).
    pub fn restart(&mut self) {
        let mut last = None;
        for _ in 0..20 {
            match self.try_restart() {
                Ok(()) => return,
                Err(error) => last = Some(error),
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("{:#}", last.expect("twenty tries"));
    }

    fn try_restart(&mut self) -> anyhow::Result<()> {
        // A server of an earlier try that never answered is not left behind.
        if let Some(mut earlier) = self.child.take() {
            let _ = earlier.kill();
            let _ = earlier.wait();
        }
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("redis-server does not start (is it installed?)")?;
        self.child = Some(child);
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            // Exited: its port was taken meanwhile (another test's server,
            // or a client's connection that happened to draw it).
            if let Some(child) = self.child.as_mut() {
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        anyhow::bail!("redis-server did not start on port {}", self.port)
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is
    /// answered, as with a stuck process, a frozen VM or a `DEBUG SLEEP`.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
        }
    }

    pub fn stop(&mut self) {
        self.thaw();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn commandstats_lines_give_calls_by_name() {
        let info = "# Commandstats\r\ncmdstat_ping:calls=12,usec=3,usec_per_call=0.25,rejected_calls=0,failed_calls=0\r\ncmdstat_client|setinfo:calls=2,usec=1\r\n";
        let stats = super::commandstats(info);
        assert_eq!(stats.get("ping"), Some(&12));
        assert_eq!(stats.get("client|setinfo"), Some(&2));
        assert_eq!(stats.len(), 2);
    }

    #[test]
    fn a_redis_urls_address_leaves_out_the_user_and_the_database() {
        assert_eq!(
            super::redis_addr_of("redis://:pw@10.0.0.2:6380/3"),
            "10.0.0.2:6380"
        );
        assert_eq!(
            super::redis_addr_of("redis://127.0.0.1:6379"),
            "127.0.0.1:6379"
        );
    }
}
