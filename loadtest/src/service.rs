//! The service under test: either one this driver starts (the release
//! `seckill` binary on a free port, a fresh database, the local Redis under
//! a fresh key prefix; or several such instances sharing them) or an
//! existing deployment given by URL.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};

pub struct Target {
    /// The first (or only) instance.
    pub base: String,
    /// Every instance, `base` first.
    pub bases: Vec<String>,
    pub admin_token: String,
    /// The database of a service we started: its invariants are checked in
    /// SQL too, and it is dropped afterwards.
    pub database_url: Option<String>,
    children: Vec<Child>,
    db_name: Option<String>,
}

/// How to start our own service.
pub struct Launch {
    pub seckill_bin: Option<PathBuf>,
    pub pg_pool: Option<u32>,
    pub keep_db: bool,
    /// Instances sharing the database and the Redis prefix (at least 1).
    pub instances: usize,
    /// Extra environment for every instance.
    pub env: Vec<(String, String)>,
}

fn pg_server() -> String {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/seckill".into());
    let url = url.split('?').next().unwrap_or(&url).to_owned();
    match url.rsplit_once('/') {
        Some((server, _)) if server.contains("//") && !server.ends_with('/') => server.to_owned(),
        _ => url,
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The seckill binary: given, or built next to this driver by cargo.
fn seckill_binary(given: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(path) = given {
        return Ok(path);
    }
    let here = std::env::current_exe().map_err(|e| e.to_string())?;
    let sibling = here.with_file_name(format!("seckill{}", std::env::consts::EXE_SUFFIX));
    // Under `cargo run`, keep the service as fresh as the driver: cargo
    // builds it (a no-op when it is up to date).
    if let Ok(cargo) = std::env::var("CARGO") {
        let release = here
            .parent()
            .and_then(|p| p.file_name())
            .is_some_and(|n| n == "release");
        let mut build = Command::new(cargo);
        build.args(["build", "--quiet", "--bin", "seckill", "-p", "seckill"]);
        if release {
            build.arg("--release");
        }
        let status = build
            .status()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if !status.success() {
            return Err("building the seckill binary failed".into());
        }
    }
    if sibling.exists() {
        Ok(sibling)
    } else {
        Err(format!(
            "no seckill binary at {}: run `cargo build --release` or pass --seckill-bin",
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
            children: Vec::new(),
            db_name: None,
        }
    }

    pub async fn start(launch: Launch) -> Result<Self, String> {
        let bin = seckill_binary(launch.seckill_bin)?;
        let run = uuid::Uuid::new_v4().simple().to_string();
        let db_name = format!("seckill_load_{run}");
        let database_url = format!("{}/{db_name}", pg_server());
        let admin_token = format!("load-{run}");
        let mut target = Self {
            base: String::new(),
            bases: Vec::new(),
            admin_token,
            database_url: Some(database_url.clone()),
            children: Vec::new(),
            db_name: (!launch.keep_db).then_some(db_name),
        };
        // One at a time: the first creates the database and migrates it.
        for _ in 0..launch.instances.max(1) {
            let port = free_port().map_err(|e| e.to_string())?;
            let mut command = Command::new(&bin);
            command
                .arg("serve")
                .env("DATABASE_URL", &database_url)
                .env("SECKILL_ADDR", format!("127.0.0.1:{port}"))
                .env("SECKILL_ADMIN_TOKEN", &target.admin_token)
                // Instances of one run share the token key and the prefix.
                .env("SECKILL_TOKEN_SECRET", format!("secret-{run}"))
                .env("SECKILL_REDIS_PREFIX", format!("load:{run}:"))
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
                    return Err(format!("cannot start {}: {e}", bin.display()));
                }
            };
            let base = format!("http://127.0.0.1:{port}");
            target.children.push(child);
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
        self.children.get(i).map(Child::id)
    }

    async fn wait_ready(&mut self, base: &str, limit: Duration) -> Result<(), String> {
        let client = reqwest::Client::new();
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(child) = self.children.last_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("seckill exited at start-up: {status}"));
                }
            }
            if let Ok(r) = client.get(format!("{base}/readyz")).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("seckill at {base} was not ready within {limit:?}"))
    }

    /// Stops a service we started (SIGTERM, so it drains) and drops its
    /// database. A remote target is left alone.
    pub async fn stop(mut self) {
        for mut child in self.children.drain(..) {
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
