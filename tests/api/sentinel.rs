//! Redis Sentinel: the service finds the master through the sentinels
//! (`REDIS_URL=redis+sentinel://...`), and after the master dies and the
//! sentinels promote its replica, sells again by itself: no 500, every
//! invariant held.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;

use crate::helpers::{buy, free_port, loopback_hosts, spawn_app_on_redis, wait_until, OwnRedis};

/// Three sentinels watching `master` as "mymaster", on free ports.
struct Sentinels {
    ports: Vec<u16>,
    dir: PathBuf,
    children: Vec<Child>,
}

impl Sentinels {
    fn start(master: &OwnRedis) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "seckill-sentinel-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut sentinels = Self {
            ports: Vec::new(),
            dir,
            children: Vec::new(),
        };
        for i in 0..3 {
            let port = free_port();
            let conf = sentinels.dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor mymaster 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds mymaster 1000\n\
                     sentinel failover-timeout mymaster 3000\n\
                     sentinel parallel-syncs mymaster 1\n",
                    dir = sentinels.dir.display(),
                    master = master.port,
                ),
            )
            .unwrap();
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server runs as a sentinel");
            sentinels.children.push(child);
            sentinels.ports.push(port);
        }
        for port in &sentinels.ports {
            let listening = || std::net::TcpStream::connect(("127.0.0.1", *port)).is_ok();
            let (bound, pause) = (Duration::from_secs(5), Duration::from_millis(25));
            wait_until(bound, pause, "a sentinel did not start", listening);
        }
        sentinels
    }

    fn url(&self) -> String {
        self.url_after(&[])
    }

    /// The URL naming `first` before the sentinels.
    fn url_after(&self, first: &[u16]) -> String {
        let hosts = loopback_hosts(first.iter().chain(&self.ports).copied());
        format!("redis+sentinel://{hosts}/mymaster")
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_follows_a_sentinel_failover_by_itself() {
    let mut master = OwnRedis::start();
    let master_port = master.port.to_string();
    let replica = OwnRedis::start_with(&["--replicaof", "127.0.0.1", &master_port]);
    let sentinels = Sentinels::start(&master);
    let url = sentinels.url();
    let app = spawn_app_on_redis(url, Some(1_000)).await;
    let second = app.spawn_instance().await;
    let voucher = app.open_voucher(1_000).await;
    let tokens = app.tokens(1..=2_000).await;
    for user in 1..=10 {
        let base = if user % 2 == 0 { &app.base } else { &second };
        let (status, code) = buy(&app.client, base, &tokens[&user], voucher).await;
        assert_eq!(status, StatusCode::OK, "{code}");
    }
    // Let the replica catch up, then the master dies.
    tokio::time::sleep(Duration::from_millis(500)).await;
    master.stop();
    let mut user = 11;
    let (resumed, unavailable) = app
        .buy_until_resumed(
            &[&app.base, &second],
            &tokens,
            voucher,
            &mut user,
            Duration::from_secs(40),
            Duration::from_millis(100),
        )
        .await;
    eprintln!("sales resumed {resumed:?} after the master died ({unavailable} answers 503)");
    // Both instances sell on the new master.
    for _ in 0..10 {
        for base in [&app.base, &second] {
            let (status, code) = buy(&app.client, base, &tokens[&user], voucher).await;
            user += 1;
            assert_eq!(status, StatusCode::OK, "{code}");
        }
    }
    app.wait_ready().await;
    app.check_invariants(voucher).await;
    drop(replica);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_first_sentinel_does_not_keep_the_others_from_being_asked() {
    let master = OwnRedis::start();
    let sentinels = Sentinels::start(&master);
    // The first sentinel named accepts and never answers: frozen, or
    // black-holed by the network.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let app = spawn_app_on_redis(sentinels.url_after(&[silent_port]), Some(1_000)).await;
    let voucher = app.open_voucher(10).await;
    let tokens = app.tokens(1..=3).await;
    for user in 1..=3 {
        let (status, code) = buy(&app.client, &app.base, &tokens[&user], voucher).await;
        assert_eq!(status, StatusCode::OK, "user {user}: {code}");
    }
    app.wait_ready().await;
    app.check_invariants(voucher).await;
    held.abort();
}
