//! The service under test: either one this driver starts (the release
//! `seckill` binary on a free port, a fresh database, the local Redis under
//! a fresh key prefix; or several such instances sharing them) or an
//! existing deployment given by URL.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
pub use testkit::{delete_keys, pg_server, redis_url};
use testkit::{drop_database_on, ServiceProcess};

use crate::drive::{drive, Plan, Request, Tally};

pub struct Target {
    /// The first (or only) instance.
    pub base: String,
    /// Every instance, `base` first.
    pub bases: Vec<String>,
    pub admin_token: String,
    /// The Redis the service uses, where a started one's keys are
    /// deleted afterwards and its CPU is read.
    pub redis_url: String,
    /// The database of a service we started: its invariants are checked in
    /// SQL too, and it is dropped afterwards.
    pub database_url: Option<String>,
    /// Behind a lock so that an instance can be killed (a direct signal,
    /// no `kill` process to wait for) while requests use the target.
    children: Mutex<Vec<ServiceProcess>>,
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
    /// The Redis of the instances (by default `REDIS_URL`'s).
    pub redis_url: String,
}

impl Launch {
    /// Starts the service, runs `body` on it and stops it, whatever
    /// `body` returned, and also when the driver is interrupted (Ctrl-C or
    /// SIGTERM): the service's database and Redis keys are dropped then
    /// too, instead of being left behind.
    pub async fn run<T>(
        self,
        body: impl AsyncFnOnce(&Target) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let target = Target::start(self).await?;
        let result = unless_interrupted(body(&target)).await;
        target.stop().await;
        result
    }
}

/// `work`'s result, unless the driver is interrupted first (Ctrl-C or
/// SIGTERM): then an error that says so, and `work` is dropped, so that the
/// caller goes on to stop the service it started and drop its database.
pub async fn unless_interrupted<T>(
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::select! {
        result = work => result,
        signal = interrupted() => Err(anyhow::anyhow!(
            "interrupted by {signal}: the services this run started are stopped and their databases dropped"
        )),
    }
}

/// Waits for Ctrl-C (SIGINT) or SIGTERM; which one came.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        Ok(()) = tokio::signal::ctrl_c() => "SIGINT",
        Some(()) = term.recv() => "SIGTERM",
        // Neither can be listened for: never interrupted.
        else => std::future::pending().await,
    }
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
            redis_url: redis_url(),
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
            redis_url: launch.redis_url.clone(),
            database_url: Some(database_url.clone()),
            children: Mutex::new(Vec::new()),
            db_name: (!launch.keep_db).then_some(db_name),
            redis_prefix: (!launch.keep_db).then(|| prefix.clone()),
        };
        // One at a time: the first creates the database and migrates it.
        for _ in 0..launch.instances.max(1) {
            let mut command = Command::new(&bin);
            command
                .arg("serve")
                .env("DATABASE_URL", &database_url)
                .env("REDIS_URL", &launch.redis_url)
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
                .stdout(Stdio::null());
            if let Some(pool) = launch.pg_pool {
                command.env("SECKILL_PG_POOL", pool.to_string());
            }
            match ServiceProcess::start(command, Duration::from_secs(60)).await {
                Ok(process) => {
                    target.bases.push(process.base().to_owned());
                    target
                        .children
                        .get_mut()
                        .expect("children lock")
                        .push(process);
                }
                Err(e) => {
                    target.stop().await;
                    anyhow::bail!("{}: {e}", bin.display());
                }
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
            .map(ServiceProcess::pid)
    }

    /// `kill -9` of instance `i` (0-based) of a service we started: no
    /// shutdown, nothing drained or acknowledged. Its pid, once sent.
    pub fn kill(&self, i: usize) -> Option<u32> {
        let mut children = self.children.lock().expect("children lock");
        let process = children.get_mut(i)?;
        process.kill();
        Some(process.pid())
    }

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

    /// Stops a service we started (SIGTERM, so it drains) and drops its
    /// database. A remote target is left alone.
    pub async fn stop(mut self) {
        let children = std::mem::take(self.children.get_mut().expect("children lock"));
        for process in children {
            process.stop(Duration::from_secs(15)).await;
        }
        if let (Some(db_name), Some(prefix)) = (self.db_name.take(), self.redis_prefix.take()) {
            drop_database_on(&pg_server(), &self.redis_url, &db_name, &prefix).await;
        }
    }
}
