//! Redis failing over behind one fixed address (a proxy, a managed
//! endpoint): the old master turns replica and answers `READONLY` on the
//! connections that still reach it. The service tells `/readyz` the truth,
//! answers 503 (never 500), drops those connections and sells again on the
//! new master by itself.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::helpers::{buy, redis_conn, spawn_app_on_redis, OwnRedis};
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
    let app = spawn_app_on_redis(url, Some(1_000)).await;
    let (voucher, tokens) = app.warm_sale(100, 200).await;
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
    let (resumed, unavailable) = app
        .buy_until_resumed(
            &[&app.base],
            &tokens,
            voucher,
            &mut 2,
            Duration::from_secs(20),
            Duration::from_millis(50),
        )
        .await;
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
    let app = spawn_app_on_redis(url, None).await;
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
    app.assert_bought(&token, voucher).await;
    drop(master);
}

/// One request's answer and how long it took.
struct Timed {
    what: &'static str,
    status: StatusCode,
    took: Duration,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_no_master_exists_every_request_answers_within_the_deadline() {
    // A master and its replica behind one address, as haproxy keeps them:
    // the master is demoted (its connections answer READONLY to writes,
    // MASTERDOWN to reads), then no server is up and haproxy holds new
    // connections, then the replica is promoted and the address leads there.
    let first = OwnRedis::start_with(&["--replica-serve-stale-data", "no"]);
    let second = OwnRedis::start_with(&["--replicaof", "127.0.0.1", &first.port.to_string()]);
    let proxy = Proxy::start(first.addr()).await;
    let url = format!("redis://{}", proxy.addr);
    let deadline = Duration::from_millis(1_000);
    let app = spawn_app_on_redis(url, Some(1_000)).await;
    let (voucher, tokens) = app.warm_sale(1_000, 400).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Requests keep coming, a purchase and a /readyz every 50 ms.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let driver = {
        let (client, base, tokens) = (app.client.clone(), app.base.clone(), tokens.clone());
        tokio::spawn(async move {
            let mut sent = tokio::task::JoinSet::new();
            let mut user = 2;
            while !*stopped.borrow() && user <= 400 {
                let token = tokens[&user].clone();
                let (c, b) = (client.clone(), base.clone());
                sent.spawn(async move {
                    let started = Instant::now();
                    let (status, _) = buy(&c, &b, &token, voucher).await;
                    Timed {
                        what: "purchase",
                        status,
                        took: started.elapsed(),
                    }
                });
                let (c, b) = (client.clone(), base.clone());
                sent.spawn(async move {
                    let started = Instant::now();
                    let status = c
                        .get(format!("{b}/readyz"))
                        .send()
                        .await
                        .expect("/readyz answers")
                        .status();
                    Timed {
                        what: "readyz",
                        status,
                        took: started.elapsed(),
                    }
                });
                user += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            sent.join_all().await
        })
    };

    // Demoted: replica of a master that does not exist.
    let nowhere = crate::helpers::free_port().to_string();
    run(&first, &["REPLICAOF", "127.0.0.1", &nowhere]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // No server up: new connections are held; open ones still reach the
    // demoted master.
    proxy.hold_new();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The replica is promoted and the address leads to it.
    run(&second, &["REPLICAOF", "NO", "ONE"]).await;
    proxy.retarget(second.addr());
    proxy.release();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.send_replace(true);
    let answers = driver.await.unwrap();

    let unavailable = answers
        .iter()
        .filter(|a| a.status == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    let slowest = answers.iter().map(|a| a.took).max().unwrap_or_default();
    eprintln!(
        "{} answers while no master existed, {unavailable} of them 503, the slowest in {slowest:?}",
        answers.len()
    );
    assert!(
        unavailable > 0,
        "the outage was seen: {} answers",
        answers.len()
    );
    for answer in &answers {
        assert!(
            [StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE].contains(&answer.status),
            "{} answered {}",
            answer.what,
            answer.status
        );
        // The deadline, and as much again for scheduling on a busy machine:
        // what this guards against is waits of several deadlines in a row.
        assert!(
            answer.took < deadline * 2,
            "{} took {:?} with a {deadline:?} deadline",
            answer.what,
            answer.took
        );
    }
    // And sales go on on the new master.
    let started = Instant::now();
    let mut user = 400;
    loop {
        let (status, body) = buy(&app.client, &app.base, &tokens[&user], voucher).await;
        if status == StatusCode::OK {
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no sale resumed"
        );
        user -= 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.check_invariants(voucher).await;
}
