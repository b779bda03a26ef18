//! Redis failing over behind one fixed address (a proxy, a managed
//! endpoint): the old master turns replica and answers `READONLY` on the
//! connections that still reach it. The service tells `/readyz` the truth,
//! answers 503 (never 500), drops those connections and sells again on the
//! new master by itself.

use std::time::{Duration, Instant};

use deadpool_redis::redis;
use reqwest::StatusCode;

use crate::helpers::{buy, redis_conn, spawn_app_with, OwnRedis};
use crate::proxy::Proxy;

async fn run(redis: &OwnRedis, command: &[&str]) {
    let mut conn = redis_conn(&redis.url()).await;
    let mut cmd = redis::cmd(command[0]);
    for arg in &command[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async::<()>(&mut conn).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_behind_one_address_is_followed_without_a_restart() {
    let first = OwnRedis::start();
    let master_port = first.port.to_string();
    let second = OwnRedis::start_with(&["--replicaof", "127.0.0.1", &master_port]);
    let proxy = Proxy::start(first.addr()).await;
    let url = format!("redis://{}", proxy.addr);
    let app = spawn_app_with(|mut s| {
        s.redis_url = url;
        s.dependency_timeout_ms = 1_000;
        s
    })
    .await;
    let voucher = app.open_voucher(100).await;
    let tokens = app.tokens(1..=200).await;
    assert!(buy(&app.client, &app.base, &tokens[&1], voucher)
        .await
        .1
        .starts_with("ok:"));
    // Let the replica catch up, then fail over: the replica is promoted,
    // the old master follows it, the address now leads to the new master.
    tokio::time::sleep(Duration::from_millis(300)).await;
    run(&second, &["REPLICAOF", "NO", "ONE"]).await;
    run(
        &first,
        &["REPLICAOF", "127.0.0.1", &second.port.to_string()],
    )
    .await;
    proxy.retarget(second.addr());

    // The service's connections still reach the old master, now a replica.
    let started = Instant::now();
    let mut user = 2;
    let mut unavailable = 0;
    let resumed = loop {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "sales did not resume after the failover"
        );
        let (status, code) = buy(&app.client, &app.base, &tokens[&user], voucher).await;
        assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR, "{code}");
        if status == StatusCode::OK {
            break started.elapsed();
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{code}");
        unavailable += 1;
        user += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    eprintln!("sales resumed {resumed:?} after the failover ({unavailable} answers 503)");
    let sold = app.check_invariants(voucher).await;
    assert_eq!(sold, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_503_while_redis_takes_no_writes() {
    let master = OwnRedis::start();
    let port = master.port.to_string();
    let replica = OwnRedis::start_with(&["--replicaof", "127.0.0.1", &port]);
    let url = replica.url();
    let app = spawn_app_with(|mut s| {
        s.redis_url = url;
        s
    })
    .await;
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    let voucher = app.open_voucher(5).await;
    let token = app.token(1).await;
    let (status, code) = buy(&app.client, &app.base, &token, voucher).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
    );

    run(&replica, &["REPLICAOF", "NO", "ONE"]).await;
    app.wait_ready().await;
    assert!(buy(&app.client, &app.base, &token, voucher)
        .await
        .1
        .starts_with("ok:"));
    drop(master);
}
