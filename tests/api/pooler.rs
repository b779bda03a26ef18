//! Postgres behind pgbouncer in transaction mode, the common production
//! setup: two instances sell through it with every invariant held, while
//! the migrations go over a direct connection.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use seckill::config::PgPooler;

use crate::helpers::{crowd, free_port, pg_server, spawn_app_with};

/// A private pgbouncer in transaction mode in front of the tests' Postgres,
/// on a free port; stopped when dropped.
struct Pgbouncer {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl Pgbouncer {
    fn start() -> Self {
        let server = pg_server();
        let hostport = server.rsplit('@').next().unwrap_or(&server);
        let hostport = hostport.trim_start_matches("postgres://");
        let (host, pg_port) = hostport.split_once(':').unwrap_or((hostport, "5432"));
        let user = server
            .split("://")
            .nth(1)
            .and_then(|r| r.split_once('@'))
            .map_or("postgres", |(user, _)| {
                user.split(':').next().unwrap_or("postgres")
            });
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "seckill-pgbouncer-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let ini = format!(
            "[databases]\n* = host={host} port={pg_port}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {auth}\npool_mode = transaction\n\
             max_client_conn = 500\ndefault_pool_size = 10\n\
             logfile = {log}\npidfile = {pid}\n",
            auth = dir.join("users.txt").display(),
            log = dir.join("pgbouncer.log").display(),
            pid = dir.join("pgbouncer.pid").display(),
        );
        std::fs::write(dir.join("users.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        // pgbouncer refuses to run as root: as root, it runs as postgres.
        let _ = Command::new("chmod")
            .arg("-R")
            .arg("a+rwX")
            .arg(&dir)
            .status();
        let binary = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("pgbouncer");
        let mut command = Command::new(binary);
        if is_root() {
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pgbouncer is installed (scripts/deps.sh installs it)");
        // Owned from here: a panic below stops it through Drop.
        let bouncer = Self { port, dir, child };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return bouncer;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("pgbouncer did not start on port {port}");
    }

    /// `DATABASE_URL` of `database` through this pgbouncer.
    fn url(&self, database: &str) -> String {
        let server = pg_server();
        let user = server
            .split("://")
            .nth(1)
            .and_then(|r| r.split_once('@'))
            .map(|(user, _)| format!("{user}@"))
            .unwrap_or_default();
        format!("postgres://{user}127.0.0.1:{}/{database}", self.port)
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sell_through_pgbouncer_in_transaction_mode_needs_pgbouncer() {
    let bouncer = Pgbouncer::start();
    let app = spawn_app_with(|mut s| {
        let database = s.database_url.rsplit('/').next().unwrap().to_owned();
        s.database_direct_url = Some(s.database_url.clone());
        s.database_url = bouncer.url(&database);
        s.pg_pooler = PgPooler::Transaction;
        s
    })
    .await;
    let second = app.spawn_instance().await;
    let voucher = app.open_voucher(50).await;
    let tokens = app.tokens(1..=150).await;
    // Every user twice at once, once on each instance.
    let answers = crowd(&[&app.base, &second], &tokens, voucher, 2).await;
    for (user, status, code) in &answers {
        assert!(
            code.starts_with("ok:")
                || ["sold_out", "already_purchased", "purchase_in_progress"]
                    .contains(&code.as_str()),
            "user {user}: {status} {code}"
        );
    }
    assert_eq!(app.check_invariants(voucher).await, 50);
    // Reads go through it too.
    let (status, stats) = app
        .admin_get(&format!("/admin/vouchers/{voucher}/stats"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stats["orders"], 50);
}
