//! The service as a process of its own, for the API tests that kill it and
//! for every load test: started on a free loopback port, ready when
//! `/readyz` answers 200, stopped with SIGTERM (it drains) or killed; and
//! the clean-up of a run's database and Redis keys.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::{Connection, PgConnection};

use crate::{delete_keys, free_port, pg_server, redis_url};

/// One running process of the service's binary; killed when dropped.
pub struct ServiceProcess {
    child: Child,
    base: String,
}

impl ServiceProcess {
    /// Runs `command` (the binary with its settings, all but its address,
    /// its output where the caller sends it) on a free loopback port, given
    /// to it as `SECKILL_ADDR`, and waits until it is ready. Fails, with
    /// the process killed, if it exits first or is not ready within `limit`.
    pub async fn start(mut command: Command, limit: Duration) -> anyhow::Result<Self> {
        let port = free_port().context("no free port")?;
        let child = command
            .env("SECKILL_ADDR", format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {:?}", command.get_program()))?;
        let mut process = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        process.wait_ready(limit).await?;
        Ok(process)
    }

    async fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .context("no HTTP client")?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                anyhow::bail!("seckill exited at start-up: {status}");
            }
            if let Ok(r) = client.get(format!("{}/readyz", self.base)).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if started.elapsed() >= limit {
                anyhow::bail!("seckill at {} was not ready within {limit:?}", self.base);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Its address, `http://127.0.0.1:PORT`.
    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `kill -9`: no shutdown, nothing flushed or acknowledged.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, so that it drains; killed if still running after `grace`.
    pub async fn stop(mut self, grace: Duration) {
        // Killed or exited already: its pid may be another's by now.
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.kill();
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Drops a run's database on the Postgres of [`pg_server`] and deletes its
/// keys under `prefix` in the Redis of [`redis_url`]; what is already gone
/// is no error.
pub async fn drop_database(db_name: &str, prefix: &str) {
    drop_database_on(&pg_server(), &redis_url(), db_name, prefix).await;
}

/// [`drop_database`] on the Postgres at `server` (a URL without database)
/// and the Redis at `redis`.
pub async fn drop_database_on(server: &str, redis: &str, db_name: &str, prefix: &str) {
    if let Ok(mut conn) = PgConnection::connect(&format!("{server}/postgres")).await {
        let _ = sqlx::query(&format!(
            "DROP DATABASE IF EXISTS \"{db_name}\" WITH (FORCE)"
        ))
        .execute(&mut conn)
        .await;
    }
    delete_keys(redis, prefix).await;
}
