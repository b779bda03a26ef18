//! Async (Redis-first) sales: `202 pending` from one Lua script, orders
//! written by the stream's consumer group, and nothing accepted lost when a
//! consumer dies, Redis restarts or Postgres is away.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{spawn_app_with, OwnRedis, TestApp, ADMIN_TOKEN};
use crate::proxy::spawn_app_behind_pg_proxy;

impl TestApp {
    /// An async voucher on sale from a minute ago for an hour.
    async fn open_async_voucher(&self, stock: i64) -> i64 {
        let now = Utc::now();
        let response = self
            .client
            .post(self.url("/admin/vouchers"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({
                "title": "async voucher",
                "stock": stock,
                "begin_time": now - chrono::Duration::minutes(1),
                "end_time": now + chrono::Duration::hours(1),
                "sale_mode": "async",
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        response.json::<Value>().await.unwrap()["id"]
            .as_i64()
            .unwrap()
    }

    async fn reconcile(&self, voucher: i64) -> (StatusCode, Value) {
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

    /// Waits until every one of `orders` is `confirmed`.
    async fn wait_confirmed(&self, orders: &[String]) {
        let started = Instant::now();
        for order in orders {
            loop {
                let (status, body) = self.admin_get(&format!("/orders/{order}")).await;
                if status == StatusCode::OK && body["status"] == "confirmed" {
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
    let response = app
        .client
        .post(format!("{base}/seckill/{voucher}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
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
    // The buyer sees their order, pending or confirmed; another user does not.
    let response = app
        .client
        .get(app.url(&format!("/orders/{order}")))
        .bearer_auth(&tokens[&user])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let other = if user == 1 { 2 } else { 1 };
    let response = app
        .client
        .get(app.url(&format!("/orders/{order}")))
        .bearer_auth(&tokens[&other])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

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
async fn entries_left_with_a_dead_consumer_are_claimed_and_written() {
    let redis = OwnRedis::start();
    let url = redis.url();
    let app = spawn_app_with(|mut s| {
        s.redis_url = url;
        s
    })
    .await;
    let voucher = app.open_async_voucher(1_000).await;
    let keyspace = app.keyspace().await;
    let stream = format!("{keyspace}async:{{{voucher}}}:orders");
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let tokens = app.tokens(1..=400).await;
    // A consumer that reads entries and dies without acknowledging them,
    // racing the service's writers for each one.
    let mut orders = Vec::new();
    let mut stranded = 0;
    for user in 1..=400_i64 {
        let (status, body) = post(&app, &app.base, &tokens[&user], voucher).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        orders.push(order_of(&body));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_without_persistence_pauses_the_sale_until_reconciled() {
    let mut redis = OwnRedis::start();
    let url = redis.url();
    let app = spawn_app_with(|mut s| {
        s.redis_url = url;
        s
    })
    .await;
    let voucher = app.open_async_voucher(20).await;
    let tokens = app.tokens(1..=40).await;
    let mut orders = Vec::new();
    for user in 1..=10 {
        let (status, body) = post(&app, &app.base, &tokens[&user], voucher).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        orders.push(order_of(&body));
    }
    app.wait_confirmed(&orders).await;

    // Redis comes back empty: the sale must not start over from nothing.
    redis.stop();
    redis.restart();
    let (status, body) = post(&app, &app.base, &tokens[&11], voucher).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (status, body) = post(&app, &app.base, &tokens[&1], voucher).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");

    let (status, report) = app.reconcile(voucher).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["stock"], 10);
    assert_eq!(report["buyers"], 10);
    assert_eq!(report["pending"], 0);
    assert_eq!(report["unstored"], json!([]));
    // An earlier buyer is known again; the rest of the stock sells, no more.
    let (status, body) = post(&app, &app.base, &tokens[&1], voucher).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["order_id"].as_str(), Some(orders[0].as_str()));
    let mut sold_out = 0;
    for user in 11..=40 {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_accepted_while_postgres_is_down_are_written_when_it_returns() {
    let (app, proxy) = spawn_app_behind_pg_proxy(|mut s| {
        s.dependency_timeout_ms = 500;
        s.voucher_cache_ms = 60_000;
        s
    })
    .await;
    let voucher = app.open_async_voucher(50).await;
    let tokens = app.tokens(1..=30).await;
    // The voucher's window is cached by the first purchase.
    let (status, body) = post(&app, &app.base, &tokens[&1], voucher).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let mut orders = vec![order_of(&body)];
    proxy.cut();
    for user in 2..=30 {
        let (status, body) = post(&app, &app.base, &tokens[&user], voucher).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        orders.push(order_of(&body));
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_aof_always_a_redis_killed_with_orders_pending_loses_none_of_them() {
    let mut redis = OwnRedis::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let url = redis.url();
    let (app, proxy) = spawn_app_behind_pg_proxy(|mut s| {
        s.redis_url = url;
        s.dependency_timeout_ms = 500;
        s.voucher_cache_ms = 60_000;
        s
    })
    .await;
    let voucher = app.open_async_voucher(40).await;
    let tokens = app.tokens(1..=40).await;
    let (status, body) = post(&app, &app.base, &tokens[&1], voucher).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let mut orders = vec![order_of(&body)];
    // Postgres away: the accepted orders wait in the stream.
    proxy.cut();
    for user in 2..=20 {
        let (status, body) = post(&app, &app.base, &tokens[&user], voucher).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        orders.push(order_of(&body));
    }
    // Redis is killed (SIGKILL) and comes back from its append-only file.
    redis.stop();
    redis.restart();
    proxy.restore();
    app.wait_confirmed(&orders).await;
    // Nothing to repair: the sale went on from where it was.
    for user in 21..=40 {
        let (status, body) = post(&app, &app.base, &tokens[&user], voucher).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        orders.push(order_of(&body));
    }
    app.wait_confirmed(&orders).await;
    assert_eq!(app.check_invariants(voucher).await, 40);
    let (status, report) = app.reconcile(voucher).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["stock"], 0);
    assert_eq!(report["unstored"], json!([]));
}
