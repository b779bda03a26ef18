//! The service under test: either one this driver starts (the release
//! `seckill` binary on a free port, a fresh database, the local Redis under
//! a fresh key prefix; or several such instances sharing them) or an
//! existing deployment given by URL.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::{Connection, PgConnection};
pub use testkit::{delete_keys, free_port, pg_server, redis_url};

use crate::drive::{drive, Plan, Request, Tally};

pub struct Target {
    /// The first (or only) instance.
    pub base: String,
    /// Every instance, `base` first.
    pub bases: Vec<String>,
    pub admin_token: String,
    /// The database of a service we started: its invariants are checked in
    /// SQL too, and it is dropped afterwards.
    pub database_url: Option<String>,
    /// Behind a lock so that an instance can be killed (a direct signal,
    /// no `kill` process to wait for) while requests use the target.
    children: Mutex<Vec<Child>>,
    db_name: Option<String>,
    /// The Redis prefix of a service we started, its keys deleted
    /// afterwards (kept with `--keep-db`).
    redis_prefix: Option<String>,
}

/// How to start our own service.
#[derive(Clone)]
pub struct Launch {
    pub seckill_bin: Option<PathBuf>,
    pub pg_pool: Option<u32>,
    pub keep_db: bool,
    /// Instances sharing the database and the Redis prefix (at least 1).
    pub instances: usize,
    /// Extra environment for every instance, set after the driver's own
    /// (rate limits off), so that it overrides them.
    pub env: Vec<(String, String)>,
    /// Run `seckill-lab` (the service with the lab mounted) instead.
    pub lab: bool,
}

/// The seckill binary (`seckill-lab` for the lab): given, or built next to
/// this driver by cargo.
fn seckill_binary(given: Option<PathBuf>, lab: bool) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        return Ok(path);
    }
    let name = if lab { "seckill-lab" } else { "seckill" };
    let here = std::env::current_exe()?;
    let sibling = here.with_file_name(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    // Under `cargo run`, keep the service as fresh as the driver: cargo
    // builds it (a no-op when it is up to date).
    if let Ok(cargo) = std::env::var("CARGO") {
        let release = here
            .parent()
            .and_then(|p| p.file_name())
            .is_some_and(|n| n == "release");
        let mut build = Command::new(cargo);
        let package = if lab { "seckill-lab" } else { "seckill" };
        build.args(["build", "--quiet", "--bin", name, "-p", package]);
        if release {
            build.arg("--release");
        }
        let status = build.status().context("cannot run cargo")?;
        if !status.success() {
            anyhow::bail!("building the seckill binary failed");
        }
    }
    if sibling.exists() {
        Ok(sibling)
    } else {
        Err(anyhow::anyhow!(
            "no {name} binary at {}: run `cargo build --release` (`-p seckill-lab` for the lab) or pass --seckill-bin",
            sibling.display()
        ))
    }
}

impl Target {
    pub fn remote(url: &str, admin_token: &str) -> Self {
        Self {
            base: url.trim_end_matches('/').to_owned(),
            bases: vec![url.trim_end_matches('/').to_owned()],
            admin_token: admin_token.to_owned(),
            database_url: None,
            children: Mutex::new(Vec::new()),
            db_name: None,
            redis_prefix: None,
        }
    }

    pub async fn start(launch: Launch) -> anyhow::Result<Self> {
        let bin = seckill_binary(launch.seckill_bin, launch.lab)?;
        let run = uuid::Uuid::new_v4().simple().to_string();
        let db_name = format!("seckill_load_{run}");
        let database_url = format!("{}/{db_name}", pg_server());
        // The service refuses a secret shorter than 32 bytes: the run's
        // whole id (32 hex digits) with a word before it.
        let admin_token = format!("load-admin-{run}");
        let prefix = format!("load:{run}:");
        let mut target = Self {
            base: String::new(),
            bases: Vec::new(),
            admin_token,
            database_url: Some(database_url.clone()),
            children: Mutex::new(Vec::new()),
            db_name: (!launch.keep_db).then_some(db_name),
            redis_prefix: (!launch.keep_db).then(|| prefix.clone()),
        };
        // One at a time: the first creates the database and migrates it.
        for _ in 0..launch.instances.max(1) {
            let port = free_port()?;
            let mut command = Command::new(&bin);
            command
                .arg("serve")
                .env("DATABASE_URL", &database_url)
                .env("SECKILL_ADDR", format!("127.0.0.1:{port}"))
                .env("SECKILL_ADMIN_TOKEN", &target.admin_token)
                // Instances of one run share the token key and the prefix.
                .env("SECKILL_TOKEN_SECRET", format!("load-token-secret-{run}"))
                .env("SECKILL_REDIS_PREFIX", &prefix)
                // Every scenario but `abuse` sends thousands of requests
                // from the driver's one address, many of them as one user:
                // limits off, unless the scenario's env turns them on.
                .env("SECKILL_LIMIT_PER_ADDRESS", "0")
                .env("SECKILL_LIMIT_PER_USER", "0")
                .env(
                    "RUST_LOG",
                    std::env::var("SECKILL_LOG").unwrap_or_else(|_| "warn".into()),
                )
                .envs(launch.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            if let Some(pool) = launch.pg_pool {
                command.env("SECKILL_PG_POOL", pool.to_string());
            }
            let child = match command.spawn() {
                Ok(child) => child,
                Err(e) => {
                    target.stop().await;
                    anyhow::bail!("cannot start {}: {e}", bin.display());
                }
            };
            let base = format!("http://127.0.0.1:{port}");
            target
                .children
                .get_mut()
                .expect("children lock")
                .push(child);
            target.bases.push(base.clone());
            if let Err(e) = target.wait_ready(&base, Duration::from_secs(60)).await {
                target.stop().await;
                return Err(e);
            }
        }
        target.base = target.bases[0].clone();
        Ok(target)
    }

    /// The process id of instance `i` (0-based) of a service we started.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.children
            .lock()
            .expect("children lock")
            .get(i)
            .map(Child::id)
    }

    /// `kill -9` of instance `i` (0-based) of a service we started: no
    /// shutdown, nothing drained or acknowledged. Its pid, once sent.
    pub fn kill(&self, i: usize) -> Option<u32> {
        let mut children = self.children.lock().expect("children lock");
        let child = children.get_mut(i)?;
        child.kill().ok().map(|()| child.id())
    }

    /// `per_user` purchases of `voucher` by each token's user, the users
    /// spread over the instances in turn.
    /// Each of `tokens` buys one unit of `voucher`, once, until they run
    /// out or `limit` passes.
    pub async fn buy_once(
        &self,
        voucher: i64,
        tokens: &[Arc<str>],
        limit: Duration,
        connections: usize,
        label: &str,
    ) -> Tally {
        let plan = Plan::Once(limit, self.purchases(voucher, tokens, 1));
        drive(&self.base, plan, connections, label).await
    }

    /// Each of `plan`'s requests once, in order, over `connections`.
    pub async fn send_each(&self, plan: Vec<Request>, connections: usize, label: &str) -> Tally {
        drive(&self.base, Plan::Fixed(plan), connections, label).await
    }

    /// `GET /healthz` for `limit`: the HTTP ceiling at this concurrency.
    pub async fn healthz(&self, limit: Duration, connections: usize) -> Tally {
        let plan = Plan::Timed(limit, vec![Request::get("/healthz")]);
        drive(&self.base, plan, connections, "healthz").await
    }

    pub fn purchases(&self, voucher: i64, tokens: &[Arc<str>], per_user: usize) -> Vec<Request> {
        self.purchases_over(voucher, tokens, per_user, false)
    }

    /// As [`Target::purchases`], each user's side by side in the plan;
    /// with `spread`, a user's purchases go to the instances in turn
    /// (their first to the user's own, the next to the next one).
    pub fn purchases_over(
        &self,
        voucher: i64,
        tokens: &[Arc<str>],
        per_user: usize,
        spread: bool,
    ) -> Vec<Request> {
        let path = format!("/seckill/{voucher}");
        let bases: Vec<Arc<str>> = self.bases.iter().map(|b| Arc::from(b.as_str())).collect();
        tokens
            .iter()
            .enumerate()
            .flat_map(|(i, token)| {
                let (bases, path) = (&bases, &path);
                (0..per_user).map(move |j| {
                    let turn = if spread { i + j } else { i };
                    Request::post_to(
                        bases[turn % bases.len()].clone(),
                        path.clone(),
                        token.clone(),
                    )
                })
            })
            .collect()
    }

    async fn wait_ready(&mut self, base: &str, limit: Duration) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(child) = self.children.get_mut().expect("children lock").last_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    anyhow::bail!("seckill exited at start-up: {status}");
                }
            }
            if let Ok(r) = client.get(format!("{base}/readyz")).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(anyhow::anyhow!(
            "seckill at {base} was not ready within {limit:?}"
        ))
    }

    /// Stops a service we started (SIGTERM, so it drains) and drops its
    /// database. A remote target is left alone.
    pub async fn stop(mut self) {
        let children = std::mem::take(self.children.get_mut().expect("children lock"));
        for mut child in children {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(prefix) = self.redis_prefix.take() {
            delete_keys(&redis_url(), &prefix).await;
        }
        if let Some(db_name) = self.db_name.take() {
            if let Ok(mut conn) = PgConnection::connect(&format!("{}/postgres", pg_server())).await
            {
                let _ = sqlx::query(&format!(
                    "DROP DATABASE IF EXISTS \"{db_name}\" WITH (FORCE)"
                ))
                .execute(&mut conn)
                .await;
            }
        }
    }
}
