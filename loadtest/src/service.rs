//! The service under test: either one this driver starts (the release
//! `seckill` binary on a free port, a fresh database, the local Redis under
//! a fresh key prefix) or an existing deployment given by URL.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};

pub struct Target {
    pub base: String,
    pub admin_token: String,
    /// The database of a service we started: its invariants are checked in
    /// SQL too, and it is dropped afterwards.
    pub database_url: Option<String>,
    child: Option<Child>,
    db_name: Option<String>,
}

/// How to start our own service.
pub struct Launch {
    pub seckill_bin: Option<PathBuf>,
    pub pg_pool: Option<u32>,
    pub keep_db: bool,
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
            admin_token: admin_token.to_owned(),
            database_url: None,
            child: None,
            db_name: None,
        }
    }

    pub async fn start(launch: Launch) -> Result<Self, String> {
        let bin = seckill_binary(launch.seckill_bin)?;
        let port = free_port().map_err(|e| e.to_string())?;
        let run = uuid::Uuid::new_v4().simple().to_string();
        let db_name = format!("seckill_load_{run}");
        let database_url = format!("{}/{db_name}", pg_server());
        let admin_token = format!("load-{run}");
        let mut command = Command::new(&bin);
        command
            .arg("serve")
            .env("DATABASE_URL", &database_url)
            .env("SECKILL_ADDR", format!("127.0.0.1:{port}"))
            .env("SECKILL_ADMIN_TOKEN", &admin_token)
            .env("SECKILL_REDIS_PREFIX", format!("load:{run}:"))
            .env(
                "RUST_LOG",
                std::env::var("SECKILL_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        if let Some(pool) = launch.pg_pool {
            command.env("SECKILL_PG_POOL", pool.to_string());
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut target = Self {
            base: format!("http://127.0.0.1:{port}"),
            admin_token,
            database_url: Some(database_url),
            child: Some(child),
            db_name: (!launch.keep_db).then_some(db_name),
        };
        if let Err(e) = target.wait_ready(Duration::from_secs(60)).await {
            target.stop().await;
            return Err(e);
        }
        Ok(target)
    }

    async fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let client = reqwest::Client::new();
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(child) = &mut self.child {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("seckill exited at start-up: {status}"));
                }
            }
            if let Ok(r) = client.get(format!("{}/readyz", self.base)).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "seckill at {} was not ready within {limit:?}",
            self.base
        ))
    }

    /// Stops a service we started (SIGTERM, so it drains) and drops its
    /// database. A remote target is left alone.
    pub async fn stop(mut self) {
        if let Some(mut child) = self.child.take() {
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
