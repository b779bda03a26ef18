//! Async (Redis-first) sales: `202 pending` from one Lua script, orders
//! written by the stream's consumer group, and nothing accepted lost when a
//! consumer dies, Redis restarts or Postgres is away.

use seckill::domain::VoucherId;
use seckill::kv::Keys;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use seckill::config::Settings;
use serde_json::{json, Value};

use crate::helpers::{
    answer, command_calls, redis_conn, redis_url, send_purchase, spawn_app, spawn_app_on_own_redis,
    spawn_app_with, start_process, OwnRedis, TestApp, ADMIN_TOKEN,
};
use crate::proxy::{pg_proxy, spawn_app_behind_pg_proxy, Proxy};

impl TestApp {
    pub(crate) async fn reconcile(&self, voucher: i64) -> (StatusCode, Value) {
        let response = self
            .client
            .post(self.url(&format!("/admin/vouchers/{voucher}/reconcile")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Waits until every one of `orders` is stored (`unpaid`).
    pub(crate) async fn wait_confirmed(&self, orders: &[String]) {
        let started = Instant::now();
        for order in orders {
            loop {
                let (status, body) = self.admin_get(&format!("/orders/{order}")).await;
                if status == StatusCode::OK && body["status"] == "unpaid" {
                    break;
                }
                assert!(
                    status == StatusCode::OK || status == StatusCode::SERVICE_UNAVAILABLE,
                    "order {order}: {status} {body}"
                );
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "order {order} still {body} after a minute"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Sends a purchase; returns the status and the body.
async fn post(app: &TestApp, base: &str, token: &str, voucher: i64) -> (StatusCode, Value) {
    let url = format!("{base}/seckill/{voucher}");
    let answer = send_purchase(&app.client, &url, token).await;
    (answer.status, answer.body)
}

/// Sends a purchase that must be accepted (`202`); its order id.
async fn accept(app: &TestApp, base: &str, token: &str, voucher: i64) -> String {
    let (status, body) = post(app, base, token, voucher).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    order_of(&body)
}

fn order_of(body: &Value) -> String {
    body["order_id"].as_str().expect("an order id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_crowd_is_accepted_then_confirmed_with_every_invariant_held() {
    let app = spawn_app_with(|s| s).await;
    let second = app.spawn_instance().await;
    let voucher = app.open_async_voucher(100).await;
    let (_, shown) = app.admin_get(&format!("/vouchers/{voucher}")).await;
    assert_eq!(shown["sale_mode"], "async");
    let tokens = Arc::new(app.tokens(1..=300).await);
    let mut crowd = Vec::new();
    for user in 1..=300_i64 {
        let base = if user % 2 == 0 {
            app.base.clone()
        } else {
            second.clone()
        };
        let (client, tokens) = (app.client.clone(), tokens.clone());
        crowd.push(tokio::spawn(async move {
            let response = client
                .post(format!("{base}/seckill/{voucher}"))
                .bearer_auth(&tokens[&user])
                .send()
                .await
                .unwrap();
            let status = response.status();
            (user, status, response.json::<Value>().await.unwrap())
        }));
    }
    let mut accepted = HashMap::new();
    for buyer in crowd {
        let (user, status, body) = buyer.await.unwrap();
        match status {
            StatusCode::ACCEPTED => {
                assert_eq!(body["status"], "pending");
                accepted.insert(user, order_of(&body));
            }
            StatusCode::CONFLICT => assert_eq!(body["error"], "sold_out", "{body}"),
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!(accepted.len(), 100, "accepted exactly the stock");
    // A second purchase of a buyer names the first order.
    let (&user, order) = accepted.iter().next().unwrap();
    let (status, body) = post(&app, &app.base, &tokens[&user], voucher).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "already_purchased");
    assert_eq!(body["order_id"].as_str(), Some(order.as_str()));
    // The buyer sees their order, pending or stored; another user does not.
    let (status, _) = app
        .get_as(&format!("/orders/{order}"), &tokens[&user])
        .await;
    assert_eq!(status, StatusCode::OK);
    let other = if user == 1 { 2 } else { 1 };
    let (status, _) = app
        .get_as(&format!("/orders/{order}"), &tokens[&other])
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let orders: Vec<String> = accepted.values().cloned().collect();
    app.wait_confirmed(&orders).await;
    assert_eq!(app.check_invariants(voucher).await, 100);
    let stored: Vec<(i64, i64)> =
        sqlx::query_as("SELECT id, user_id FROM voucher_orders WHERE voucher_id = $1 ORDER BY id")
            .bind(voucher)
            .fetch_all(&app.db)
            .await
            .unwrap();
    for (id, user) in stored {
        assert_eq!(
            accepted.get(&user),
            Some(&id.to_string()),
            "the 202's order id is the stored one"
        );
    }
    let (_, shown) = app.admin_get(&format!("/vouchers/{voucher}")).await;
    assert_eq!(shown["stock"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_reconciliations_during_a_crowd_never_sell_a_unit_twice() {
    let app = spawn_app_with(|s| s).await;
    let second = app.spawn_instance().await;
    let voucher = app.open_async_voucher(100).await;
    let tokens = Arc::new(app.tokens(1..=300).await);
    let bases = [app.base.clone(), second];
    // Reconciliations on both instances, three at a time, for as long as
    // the crowd buys: each pauses the sale and rebuilds it from its
    // snapshot; they overlap often, and the sale is open now and then.
    let crowd_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut reconcilers = Vec::new();
    for i in 0..3 {
        let (client, base, done) = (app.client.clone(), bases[i % 2].clone(), crowd_done.clone());
        reconcilers.push(tokio::spawn(async move {
            let mut finished = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let response = client
                    .post(format!("{base}/admin/vouchers/{voucher}/reconcile"))
                    .bearer_auth(ADMIN_TOKEN)
                    .send()
                    .await
                    .unwrap();
                match response.status() {
                    StatusCode::OK => finished += 1,
                    // Another one took over, or Redis was busy.
                    StatusCode::SERVICE_UNAVAILABLE => {}
                    other => panic!("reconcile: {other}"),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            finished
        }));
    }
    // The crowd: a user asks again while the sale is paused (503).
    let mut crowd = Vec::new();
    for user in 1..=300_i64 {
        let (client, base, tokens) = (
            app.client.clone(),
            bases[user as usize % 2].clone(),
            tokens.clone(),
        );
        crowd.push(tokio::spawn(async move {
            loop {
                let url = format!("{base}/seckill/{voucher}");
                let answer = send_purchase(&client, &url, &tokens[&user]).await;
                if answer.status != StatusCode::SERVICE_UNAVAILABLE {
                    return (answer.status, answer.body);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    let mut orders = Vec::new();
    let mut sold_out = 0;
    for buyer in crowd {
        match buyer.await.unwrap() {
            (StatusCode::ACCEPTED, body) => orders.push(order_of(&body)),
            (StatusCode::CONFLICT, body) if body["error"] == "sold_out" => sold_out += 1,
            (status, body) => panic!("{status}: {body}"),
        }
    }
    crowd_done.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut finished = 0;
    for reconciler in reconcilers {
        finished += reconciler.await.unwrap();
    }
    assert!(finished > 0, "no reconciliation finished during the crowd");
    assert_eq!(
        orders.len(),
        100,
        "accepted exactly the stock ({finished} reconciliations)"
    );
    assert_eq!(sold_out, 200);
    app.wait_confirmed(&orders).await;
    assert_eq!(app.check_invariants(voucher).await, 100);
    let (status, report) = app.reconcile(voucher).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["stock"], 0);
    assert_eq!(report["buyers"], 100);
    assert_eq!(report["unstored"], json!([]));
    // Every reconciliation's rebuilt buyers were swapped in or deleted.
    let keyspace = app.keyspace().await;
    let mut conn = redis_conn(&redis_url()).await;
    let staged: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{keyspace}async:{{{voucher}}}:buyers:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(staged, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_left_with_a_dead_consumer_are_claimed_and_written() {
    let (redis, app) = spawn_app_on_own_redis(None).await;
    let voucher = app.open_async_voucher(1_000).await;
    let keyspace = app.keyspace().await;
    let stream = Keys::new(keyspace.as_str())
        .async_sale(VoucherId::new(voucher).unwrap())
        .orders;
    let mut conn = redis_conn(&redis.url()).await;
    let tokens = app.tokens(1..=400).await;
    // A consumer that reads entries and dies without acknowledging them,
    // racing the service's writers for each one.
    let mut orders = Vec::new();
    let mut stranded = 0;
    for user in 1..=400_i64 {
        orders.push(accept(&app, &app.base, &tokens[&user], voucher).await);
        let taken: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("writers")
            .arg("dead-consumer")
            .arg("COUNT")
            .arg(100)
            .arg("STREAMS")
            .arg(&stream)
            .arg(">")
            .query_async(&mut conn)
            .await
            .unwrap();
        if let redis::Value::Array(streams) = taken {
            if let Some(redis::Value::Array(entry)) = streams.first() {
                if let Some(redis::Value::Array(ids)) = entry.get(1) {
                    stranded += ids.len();
                }
            }
        }
        if stranded >= 5 && user >= 50 {
            break;
        }
    }
    assert!(stranded > 0, "the dead consumer never got an entry");
    app.wait_confirmed(&orders).await;
    let pending: redis::Value = redis::cmd("XPENDING")
        .arg(&stream)
        .arg("writers")
        .query_async(&mut conn)
        .await
        .unwrap();
    let redis::Value::Array(summary) = pending else {
        panic!("XPENDING: {pending:?}")
    };
    assert_eq!(summary.first(), Some(&redis::Value::Int(0)), "{summary:?}");
    assert_eq!(
        app.check_invariants(voucher).await,
        i64::try_from(orders.len()).unwrap()
    );
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("seckill_async_claimed_total"),
        "nothing was claimed"
    );
}

/// Entries delivered to, and not acknowledged by, each consumer of the
/// voucher's group: (name, pending).
async fn consumers(
    conn: &mut redis::aio::MultiplexedConnection,
    stream: &str,
) -> Vec<(String, usize)> {
    redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(stream)
        .arg("writers")
        .query_async::<redis::streams::StreamInfoConsumersReply>(conn)
        .await
        .map(|info| {
            info.consumers
                .into_iter()
                .map(|c| (c.name, c.pending))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_mid_batch_loses_none_of_its_accepted_orders() {
    // The instance that survives (in this test's process) claims what the
    // killed one held after max(5 s, 3 x its dependency deadline).
    let app = spawn_app_with(|mut s| {
        s.dependency_timeout = Duration::from_millis(1_000);
        s
    })
    .await;
    // The instance to kill: the service's binary, its Postgres through a
    // proxy that will hold its commit in the air.
    let (proxy, via_proxy) = pg_proxy().await;
    let mut victim = start_process(
        &format!("{via_proxy}/{}", app.db_name),
        &redis_url(),
        &app.prefix,
        // The window stays cached while its Postgres hangs.
        &["--voucher-cache-ms", "600000"],
    )
    .await;
    let voucher = app.open_async_voucher(500).await;
    let keyspace = app.keyspace().await;
    let stream = Keys::new(keyspace.as_str())
        .async_sale(VoucherId::new(voucher).unwrap())
        .orders;
    let mut conn = redis_conn(&redis_url()).await;
    let tokens = app.tokens(1..=500).await;
    let victim_consumer = format!("pid{}-", victim.pid());

    // Sell through it until its writer has read an entry (a consumer
    // shows in the group once it was delivered one): it caches the voucher
    // and runs a writer for it.
    let mut orders = Vec::new();
    let mut users = 1..=500_i64;
    let started = Instant::now();
    loop {
        let user = users.next().expect("users enough");
        orders.push(accept(&app, victim.base(), &tokens[&user], voucher).await);
        if consumers(&mut conn, &stream)
            .await
            .iter()
            .any(|(name, _)| name.starts_with(&victim_consumer))
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "its writer never read"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Its Postgres hangs: it accepts, reads a batch, and its commit waits.
    // Sell until it holds entries read and not acknowledged: mid-batch.
    proxy.freeze();
    let mut held = 0;
    for user in users {
        orders.push(accept(&app, victim.base(), &tokens[&user], voucher).await);
        held = consumers(&mut conn, &stream)
            .await
            .into_iter()
            .find(|(name, _)| name.starts_with(&victim_consumer))
            .map_or(0, |(_, pending)| pending);
        if held >= 5 {
            break;
        }
    }
    assert!(held > 0, "the instance never read a batch");
    victim.kill();
    // What it had sent before dying reaches Postgres now (a transaction
    // whose client is gone rolls back, or a commit that was already on its
    // way lands): either way each order is stored once.
    proxy.thaw();

    app.wait_confirmed(&orders).await;
    assert_eq!(
        app.check_invariants(voucher).await,
        i64::try_from(orders.len()).unwrap()
    );
    // Confirmed may come first: an order the dead instance's commit stored
    // stays pending in the stream until the survivor claims, finds it held
    // under its id, and acknowledges it.
    let started = Instant::now();
    loop {
        let left = consumers(&mut conn, &stream).await;
        if left.iter().all(|(_, pending)| *pending == 0) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "entries left pending: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        app.metrics().await.contains("seckill_async_claimed_total"),
        "the survivor claimed nothing: {held} entries were held"
    );
    // The dead instance leaves no consumer behind in the group.
    let started = Instant::now();
    while consumers(&mut conn, &stream)
        .await
        .iter()
        .any(|(name, _)| name.starts_with(&victim_consumer))
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the dead instance's consumer is still in the group"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciliation_after_redis_lost_the_sale_keeps_each_users_order_count() {
    let (mut redis, app) = spawn_app_on_own_redis(None).await;
    let voucher = app
        .open_voucher_with(
            10,
            json!({ "sale_mode": "async", "max_orders_per_user": 2 }),
        )
        .await;
    let tokens = app.tokens(1..=2).await;
    // A purchase after a cancel: until the cancelled unit and its buyer are
    // back in Redis (the relay, within a second), it names the old order.
    let buy_again = |token: String| {
        let app = &app;
        async move {
            let started = Instant::now();
            loop {
                let (status, body) = post(app, &app.base, &token, voucher).await;
                if body["error"] != "already_purchased" {
                    return (status, body);
                }
                assert!(started.elapsed() < Duration::from_secs(10), "{body}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    // User 1 buys and cancels twice: two orders, the most this voucher
    // allows, neither of them live.
    for _ in 0..2 {
        let (status, body) = buy_again(tokens[&1].clone()).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let order = order_of(&body);
        app.wait_confirmed(std::slice::from_ref(&order)).await;
        let url = app.url(&format!("/orders/{order}/cancel"));
        let started = Instant::now();
        loop {
            let (status, body) = answer(app.client.post(&url).bearer_auth(&tokens[&1])).await;
            if status == StatusCode::OK {
                break;
            }
            // A cancel that meets a writer's batch on the row: retried.
            assert_eq!(body["error"], "unavailable", "{body}");
            assert!(started.elapsed() < Duration::from_secs(10), "{body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // Redis comes back empty, and the sale is rebuilt from Postgres: with
    // the count of each user's orders, not only the live ones.
    let report = app.reconcile_after_empty_redis(&mut redis, voucher).await;
    assert_eq!(
        (report["stock"].as_i64(), report["buyers"].as_i64()),
        (Some(10), Some(0)),
        "{report}"
    );
    let (status, body) = buy_again(tokens[&1].clone()).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("too_many_orders")),
        "{body}"
    );
    let (status, body) = post(&app, &app.base, &tokens[&2], voucher).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_without_persistence_rebuilds_the_sale_from_postgres() {
    let (mut redis, app) = spawn_app_on_own_redis(None).await;
    let voucher = app.open_async_voucher(20).await;
    let tokens = app.tokens(1..=40).await;
    let mut orders = Vec::new();
    for user in 1..=10 {
        orders.push(accept(&app, &app.base, &tokens[&user], voucher).await);
    }
    app.wait_confirmed(&orders).await;

    // Redis comes back empty: the sale must not start over from nothing.
    // It answers 503 until a supervisor has rebuilt it from Postgres
    // (within a second or so, no admin needed).
    redis.stop();
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = post(&app, &app.base, &tokens[&11], voucher).await;
        match status {
            StatusCode::SERVICE_UNAVAILABLE => {}
            StatusCode::ACCEPTED => {
                orders.push(order_of(&body));
                break;
            }
            other => panic!("{other}: {body}"),
        }
        assert!(Instant::now() < deadline, "the sale was never rebuilt");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // An admin's reconciliation finds it as the supervisor left it.
    let (status, report) = app.reconcile(voucher).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    app.wait_confirmed(&orders).await;
    assert_eq!(report["buyers"], 11, "{report}");
    assert_eq!(report["unstored"], json!([]));
    // An earlier buyer is known again; the rest of the stock sells, no more.
    let (status, body) = post(&app, &app.base, &tokens[&1], voucher).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["order_id"].as_str(), Some(orders[0].as_str()));
    let mut sold_out = 0;
    for user in 12..=40 {
        let (status, body) = post(&app, &app.base, &tokens[&user], voucher).await;
        match status {
            StatusCode::ACCEPTED => orders.push(order_of(&body)),
            StatusCode::CONFLICT if body["error"] == "sold_out" => sold_out += 1,
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!(orders.len(), 20);
    assert_eq!(sold_out, 20);
    app.wait_confirmed(&orders).await;
    assert_eq!(app.check_invariants(voucher).await, 20);
    // A sync voucher has nothing to reconcile.
    let sync = app.open_voucher(1).await;
    assert_eq!(app.reconcile(sync).await.0, StatusCode::BAD_REQUEST);
}

/// Settings for a sale that goes on while Postgres is away: the voucher's
/// window stays cached all test long, and a Postgres call gives up after
/// 500 ms.
fn postgres_may_go(mut s: Settings) -> Settings {
    s.dependency_timeout = Duration::from_millis(500);
    s.voucher_cache_ttl = Duration::from_secs(60);
    s
}

/// An async voucher of `stock` units and tokens for users 1 to `users`:
/// user 1 buys (the voucher's window is cached then), Postgres is cut, and
/// users 2 to `buyers` buy. The voucher, the tokens and the accepted orders.
async fn accept_with_postgres_cut(
    app: &TestApp,
    proxy: &Proxy,
    stock: i64,
    users: i64,
    buyers: i64,
) -> (i64, HashMap<i64, String>, Vec<String>) {
    let voucher = app.open_async_voucher(stock).await;
    let tokens = app.tokens(1..=users).await;
    let mut orders = vec![accept(app, &app.base, &tokens[&1], voucher).await];
    proxy.cut();
    for user in 2..=buyers {
        orders.push(accept(app, &app.base, &tokens[&user], voucher).await);
    }
    (voucher, tokens, orders)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_accepted_while_postgres_is_down_are_written_when_it_returns() {
    let (app, proxy) = spawn_app_behind_pg_proxy(postgres_may_go).await;
    let (voucher, _, orders) = accept_with_postgres_cut(&app, &proxy, 50, 30, 30).await;
    // Pending while Postgres is away.
    let (status, body) = app.admin_get(&format!("/orders/{}", orders[29])).await;
    assert!(
        status == StatusCode::SERVICE_UNAVAILABLE
            || (status == StatusCode::OK && body["status"] == "pending"),
        "{status} {body}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.restore();
    app.wait_confirmed(&orders).await;
    assert_eq!(app.check_invariants(voucher).await, 30);
}

/// Once read, an async sale's voucher is served from memory past the
/// voucher cache's lifetime: a Postgres away (a failover) stops its
/// writers, not its buyers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_sale_accepts_past_the_voucher_cache_while_postgres_is_away() {
    let (app, proxy) = spawn_app_behind_pg_proxy(|s| Settings {
        voucher_cache_ttl: Duration::from_millis(100),
        ..postgres_may_go(s)
    })
    .await;
    let voucher = app.open_async_voucher(10).await;
    let tokens = app.tokens(1..=3).await;
    let mut orders = vec![accept(&app, &app.base, &tokens[&1], voucher).await];
    proxy.freeze();
    // Ten of the cache's lifetimes: a sync sale would have to read
    // Postgres again by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for user in 2..=3 {
        orders.push(accept(&app, &app.base, &tokens[&user], voucher).await);
    }
    // The voucher's stock counts the orders accepted and not yet written
    // (Redis's stock), once its read is refreshed (at most a second).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, shown) = answer(app.client.get(app.url(&format!("/vouchers/{voucher}")))).await;
    assert_eq!(
        (status, shown["stock"].as_i64()),
        (StatusCode::OK, Some(7)),
        "{shown}"
    );
    proxy.thaw();
    app.wait_confirmed(&orders).await;
    assert_eq!(app.check_invariants(voucher).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_aof_always_a_redis_killed_with_orders_pending_loses_none_of_them() {
    let mut redis = OwnRedis::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let url = redis.url();
    let (app, proxy) = spawn_app_behind_pg_proxy(|s| Settings {
        redis_url: url,
        ..postgres_may_go(s)
    })
    .await;
    // Postgres away: the accepted orders wait in the stream.
    let (voucher, tokens, mut orders) = accept_with_postgres_cut(&app, &proxy, 40, 40, 20).await;
    // Redis is killed (SIGKILL) and comes back from its append-only file.
    redis.stop();
    redis.restart();
    proxy.restore();
    app.wait_confirmed(&orders).await;
    // Nothing to repair: the sale went on from where it was.
    for user in 21..=40 {
        orders.push(accept(&app, &app.base, &tokens[&user], voucher).await);
    }
    app.wait_confirmed(&orders).await;
    assert_eq!(app.check_invariants(voucher).await, 40);
    let (status, report) = app.reconcile(voucher).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["stock"], 0);
    assert_eq!(report["unstored"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reconciliation_leaves_nothing_that_holds_back_a_later_sale() {
    let app = spawn_app_with(|s| s).await;
    let sync = app.open_voucher(1).await;
    // Refused before anything is paused: an id no voucher has yet, and a
    // voucher sold synchronously.
    let (status, body) = app.reconcile(sync + 1).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = app.reconcile(sync).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // The next voucher takes that id; its sale opens at once.
    let voucher = app.open_async_voucher(5).await;
    assert_eq!(voucher, sync + 1);
    let tokens = app.tokens(1..=1).await;
    let order = accept(&app, &app.base, &tokens[&1], voucher).await;
    app.wait_confirmed(&[order]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_whose_loading_is_under_way_elsewhere_is_open_when_its_creation_is_answered() {
    let app = spawn_app_with(|s| s).await;
    let before = app.open_voucher(1).await;
    // Another load of the next voucher's sale is under way when it is
    // created (as when an instance's supervisor saw it first); this one
    // dies without a word, so its mark expires after 300 ms.
    let next = before + 1;
    let reconciling = Keys::new(app.keyspace().await)
        .async_sale(VoucherId::new(next).unwrap())
        .reconciling;
    let mut conn = redis_conn(&redis_url()).await;
    let _: () = redis::cmd("SET")
        .arg(&reconciling)
        .arg("a-load-elsewhere")
        .arg("PX")
        .arg(300)
        .query_async(&mut conn)
        .await
        .unwrap();
    let voucher = app.open_async_voucher(5).await;
    assert_eq!(voucher, next);
    // The creation waited for the sale to open: the first purchase is
    // accepted, not told the sale is paused.
    let tokens = app.tokens(1..=1).await;
    let order = accept(&app, &app.base, &tokens[&1], voucher).await;
    app.wait_confirmed(&[order]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_created_while_redis_is_down_opens_once_redis_is_back() {
    let (mut redis, app) = spawn_app_on_own_redis(None).await;
    redis.stop();
    // Postgres takes the voucher; loading its sale into Redis fails, here
    // and in the supervisor's first look at it.
    let voucher = app.open_async_voucher(5).await;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    redis.restart();
    let tokens = app.tokens(1..=1).await;
    let started = Instant::now();
    let order = loop {
        let (status, body) = post(&app, &app.base, &tokens[&1], voucher).await;
        match status {
            StatusCode::ACCEPTED => break order_of(&body),
            StatusCode::SERVICE_UNAVAILABLE => {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "the sale is still paused: {body}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("{other}: {body}"),
        }
    };
    app.wait_confirmed(&[order]).await;
    assert_eq!(app.check_invariants(voucher).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_writers_poll_their_streams_about_once_a_second_and_still_write() {
    let (redis, app) = spawn_app_on_own_redis(None).await;
    const SALES: u64 = 20;
    let mut vouchers = Vec::new();
    for _ in 0..SALES {
        vouchers.push(app.open_async_voucher(5).await);
    }
    let mut conn = redis_conn(&redis.url()).await;
    // Every writer started and went idle.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let before = command_calls(&mut conn, "xreadgroup").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reads = command_calls(&mut conn, "xreadgroup").await - before;
    // A 10 ms poll would read 20 x 300 = 6,000 times; once a second, 60
    // (and a few more for the claims' own reads of pending entries).
    assert!(
        reads <= SALES * 3 * 2,
        "{reads} stream reads by {SALES} idle writers in 3 s"
    );
    // And an idle writer still writes what its instance accepts.
    let tokens = app.tokens(1..=1).await;
    let order = accept(&app, &app.base, &tokens[&1], vouchers[0]).await;
    app.wait_confirmed(&[order]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_purchases_at_once_get_one_order_and_the_rest_are_refused_or_name_it() {
    let (redis, app) = spawn_app_on_own_redis(None).await;
    let voucher = app.open_async_voucher(10).await;
    let (first, token) = (app.token(1).await, app.token(7).await);
    let send = |token: String| {
        let (client, base) = (app.client.clone(), app.base.clone());
        tokio::spawn(async move {
            let url = format!("{base}/seckill/{voucher}");
            let answer = send_purchase(&client, &url, &token).await;
            (answer.status, answer.body)
        })
    };
    // Redis holds writes back for a moment: another user's purchase is the
    // voucher's call under way, and of the fifty of one user that arrive
    // meanwhile one goes to Redis in the next call; the rest are refused
    // while it is in flight, or name its order once it is accepted.
    let mut conn = redis_conn(&redis.url()).await;
    redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(600)
        .arg("WRITE")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let ahead = send(first);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let tries: Vec<_> = (0..50).map(|_| send(token.clone())).collect();
    let (status, body) = ahead.await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let mut accepted = vec![order_of(&body)];
    let mut named = Vec::new();
    let mut refused = 0;
    for attempt in tries {
        let (status, body) = attempt.await.unwrap();
        match status {
            StatusCode::ACCEPTED => accepted.push(order_of(&body)),
            StatusCode::CONFLICT => {
                assert_eq!(body["error"], "already_purchased", "{body}");
                named.push(order_of(&body));
            }
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(body["error"], "purchase_in_progress", "{body}");
                refused += 1;
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!(accepted.len(), 2, "one order for each user: {accepted:?}");
    assert_eq!(named.len() + refused, 49);
    assert!(
        refused > 0,
        "the duplicates in flight with the first are refused"
    );
    assert!(named.iter().all(|order| *order == accepted[1]), "{named:?}");
    // A try after it names the order.
    let (status, body) = send(token.clone()).await.unwrap();
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(order_of(&body), accepted[1]);
    app.wait_confirmed(&accepted).await;
    assert_eq!(app.check_invariants(voucher).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_orders_not_yet_written_are_found_by_id_as_pending_by_their_buyers_only() {
    let app = spawn_app().await;
    let voucher = app.open_async_voucher(40).await;
    let tokens = Arc::new(app.tokens(1..=31).await);
    // The writers wait behind a lock on the orders table (reads still pass).
    let mut hold = app.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE voucher_orders IN EXCLUSIVE MODE")
        .execute(&mut *hold)
        .await
        .unwrap();
    // Thirty buyers at once: their acceptances share script calls, whose
    // lookups are written together.
    let crowd: Vec<_> = (1..=30_i64)
        .map(|user| {
            let (client, base, tokens) = (app.client.clone(), app.base.clone(), tokens.clone());
            tokio::spawn(async move {
                let url = format!("{base}/seckill/{voucher}");
                (user, send_purchase(&client, &url, &tokens[&user]).await)
            })
        })
        .collect();
    let mut accepted = Vec::new();
    for buyer in crowd {
        let (user, answer) = buyer.await.unwrap();
        assert_eq!(answer.status, StatusCode::ACCEPTED, "{}", answer.body);
        accepted.push((user, order_of(&answer.body)));
    }
    for (user, order) in &accepted {
        let (status, body) = app.get_as(&format!("/orders/{order}"), &tokens[user]).await;
        assert_eq!(status, StatusCode::OK, "{order}: {body}");
        assert_eq!(body["status"], "pending", "{body}");
        assert_eq!(body["user_id"], *user, "{body}");
        assert_eq!(body["voucher_id"], voucher, "{body}");
        let (status, _) = app.get_as(&format!("/orders/{order}"), &tokens[&31]).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "another user's pending order"
        );
    }
    // The lookups expire: none is kept for ever.
    let mut conn = redis_conn(&redis_url()).await;
    let lookups: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}async-orders:*", app.keyspace().await))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!lookups.is_empty());
    for key in lookups {
        let ttl: i64 = redis::cmd("TTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0, "{key} lives {ttl}");
    }
    hold.commit().await.unwrap();
    let orders: Vec<String> = accepted.into_iter().map(|(_, order)| order).collect();
    app.wait_confirmed(&orders).await;
    assert_eq!(app.check_invariants(voucher).await, 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_who_cancels_buys_again_at_once_and_is_not_told_of_the_cancelled_order() {
    // The cancel gives the unit back to Redis before it answers: before,
    // only the relay did, moments later, and a purchase in between heard
    // already_purchased, naming the cancelled order.
    let app = spawn_app().await;
    let voucher = app
        .open_voucher_with(
            1,
            json!({ "sale_mode": "async", "max_orders_per_user": 1000 }),
        )
        .await;
    let token = app.token(1).await;
    let mut order = accept(&app, &app.base, &token, voucher).await;
    for round in 0..20 {
        app.wait_confirmed(std::slice::from_ref(&order)).await;
        let (status, body) = app.cancel(&app.base, &order, &token).await;
        assert_eq!(status, StatusCode::OK, "round {round}: {body}");
        let (status, body) = post(&app, &app.base, &token, voucher).await;
        assert_eq!(status, StatusCode::ACCEPTED, "round {round}: {body}");
        order = order_of(&body);
    }
    app.wait_confirmed(&[order]).await;
    assert_eq!(app.check_invariants(voucher).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_whose_redis_came_back_behind_postgres_is_rebuilt_when_postgres_refuses_an_order() {
    // Redis loses its last writes but keeps the sale (an AOF everysec
    // restart, a replica promoted behind): here, a stored order's unit.
    // Redis then sells one unit more than Postgres holds, and Postgres
    // refuses that order. Before, nothing noticed: Redis kept the refused
    // order as its buyer's, who was told already_purchased, naming an
    // order that does not exist, for ever. Now the refusal rebuilds the
    // sale from Postgres's books.
    let app = spawn_app().await;
    let voucher = app.open_async_voucher(3).await;
    let tokens = app.tokens(1..=4).await;
    let first = accept(&app, &app.base, &tokens[&1], voucher).await;
    app.wait_confirmed(std::slice::from_ref(&first)).await;

    let keyspace = app.keyspace().await;
    let keys = Keys::new(keyspace.as_str()).async_sale(VoucherId::new(voucher).unwrap());
    let mut conn = redis_conn(&redis_url()).await;
    let _: () = redis::cmd("HINCRBY")
        .arg(&keys.sale)
        .arg("stock")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    for user in 2..=4 {
        accept(&app, &app.base, &tokens[&user], voucher).await;
    }

    // Postgres stores two of the three; Redis's buyers become Postgres's
    // three again.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let buyers: usize = redis::cmd("HLEN")
            .arg(&keys.buyers)
            .query_async(&mut conn)
            .await
            .unwrap();
        if buyers == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Redis still counts {buyers} buyers, one of them with a refused order"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The buyer whose order was refused is told the truth: sold out.
    let mut told = Vec::new();
    for user in 2..=4 {
        let (status, body) = post(&app, &app.base, &tokens[&user], voucher).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        told.push(body["error"].as_str().unwrap().to_owned());
    }
    told.sort();
    assert_eq!(told, ["already_purchased", "already_purchased", "sold_out"]);
    assert_eq!(app.check_invariants(voucher).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_right_after_an_async_purchase_is_cancelled_or_pending_never_unavailable() {
    // Each buyer cancels the moment its 202 arrives, while the writer
    // stores the order: the cancel sees it pending, or stored, or both
    // (stored between its two reads: before, "busy", a 503).
    let app = spawn_app().await;
    let voucher = app.open_async_voucher(300).await;
    let tokens = app.tokens(1..=300).await;
    let mut tasks = tokio::task::JoinSet::new();
    let app = std::sync::Arc::new(app);
    for user in 1..=300 {
        let (app, token) = (app.clone(), tokens[&user].clone());
        tasks.spawn(async move {
            let order = accept(&app, &app.base, &token, voucher).await;
            let (status, body) = app.cancel(&app.base, &order, &token).await;
            (status, body)
        });
    }
    while let Some(answer) = tasks.join_next().await {
        let (status, body) = answer.unwrap();
        assert!(
            status == StatusCode::OK || body["error"] == "order_pending",
            "{status} {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciliation_holds_its_sale_for_a_lease_of_ten_deadlines_not_for_ten_minutes() {
    // A reconciliation stalled on its snapshot (the orders' table locked)
    // is what one in a process killed or frozen there looks like to the
    // other instances: its mark on the sale must run out within its lease
    // (ten dependency deadlines, 4 s here), not the ten minutes a rebuild
    // could take, or every supervisor waits that long to reopen the sale.
    let (app, _proxy) = crate::proxy::spawn_app_behind_pg_proxy_timing_out(400).await;
    let voucher = app.open_async_voucher(5).await;
    let reconciling = Keys::new(app.keyspace().await)
        .async_sale(VoucherId::new(voucher).unwrap())
        .reconciling;
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE voucher_orders IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let stalled = {
        let client = app.client.clone();
        let url = app.url(&format!("/admin/vouchers/{voucher}/reconcile"));
        tokio::spawn(async move { client.post(url).bearer_auth(ADMIN_TOKEN).send().await })
    };
    let conn = redis_conn(&redis_url()).await;
    let lease_left = crate::helpers::poll_until(
        Duration::from_secs(10),
        Duration::from_millis(20),
        "the stalled reconciliation's mark",
        || async {
            redis::cmd("PTTL")
                .arg(&reconciling)
                .query_async::<i64>(&mut conn.clone())
                .await
                .unwrap()
        },
        |ttl| *ttl > 0,
    )
    .await;
    assert!(lease_left <= 4_000, "{lease_left} ms");
    lock.rollback().await.unwrap();
    let answer = stalled.await.unwrap().unwrap();
    assert!(
        [StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE].contains(&answer.status()),
        "{}",
        answer.status()
    );
    // The sale reopens and sells.
    let (status, body) = app.reconcile(voucher).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let tokens = app.tokens(1..=1).await;
    let order = accept(&app, &app.base, &tokens[&1], voucher).await;
    app.wait_confirmed(&[order]).await;
}
