//! Purchases under concurrency: no oversell, one order per user, on one
//! instance and on two.

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use reqwest::StatusCode;
use seckill::domain::OrderId;
use serde_json::Value;

use crate::helpers::{buy, crowd, spawn_app, spawn_app_with, ADMIN_TOKEN};
use crate::proxy::spawn_app_behind_pg_proxy;

const REFUSALS: [&str; 3] = ["sold_out", "already_purchased", "purchase_in_progress"];

/// Asserts the crowd's answers: `stock` orders for distinct users, and
/// every other answer one of the contract's refusals.
fn assert_sold_exactly(results: &[(i64, StatusCode, String)], stock: usize) -> HashSet<i64> {
    let mut buyers = HashSet::new();
    let mut order_ids = HashSet::new();
    for (user, status, code) in results {
        if let Some(order_id) = code.strip_prefix("ok:") {
            assert_eq!(*status, StatusCode::OK);
            assert!(buyers.insert(*user), "user {user} bought twice");
            assert!(
                order_ids.insert(order_id.to_owned()),
                "order id {order_id} repeats"
            );
        } else {
            assert!(
                REFUSALS.contains(&code.as_str()),
                "unexpected answer {status} {code}"
            );
            let expected = if code == "purchase_in_progress" {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::CONFLICT
            };
            assert_eq!(*status, expected, "{code}");
        }
    }
    assert_eq!(buyers.len(), stock, "orders placed");
    buyers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flash_crowd_buys_exactly_the_stock_once_per_user() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(50).await;
    let tokens = app.tokens(1..=200).await;

    let results = crowd(&[&app.base], &tokens, voucher, 5).await;

    let buyers = assert_sold_exactly(&results, 50);
    let stats = app.stats(voucher).await;
    assert_eq!(stats["initial_stock"], 50);
    assert_eq!(stats["stock"], 0);
    assert_eq!(stats["orders"], 50);
    assert_eq!(stats["distinct_users"], 50);
    assert_eq!(app.check_invariants(voucher).await, 50);

    // The admin listing names exactly the buyers the crowd saw.
    let (status, listing) = app
        .admin_get(&format!("/admin/vouchers/{voucher}/orders"))
        .await;
    assert_eq!(status, StatusCode::OK);
    let listed: HashSet<i64> = listing["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["user_id"].as_i64().unwrap())
        .collect();
    assert_eq!(listed, buyers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_sending_a_hundred_purchases_gets_one_order() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(10).await;
    let tokens = app.tokens([7]).await;

    let results = crowd(&[&app.base], &tokens, voucher, 100).await;

    assert_sold_exactly(&results, 1);
    assert_eq!(app.check_invariants(voucher).await, 1);
    assert_eq!(app.stats(voucher).await["stock"], 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_postgres_and_redis_keep_the_invariants() {
    let app = spawn_app().await;
    let voucher = two_instance_crowd(&app).await;
    assert_eq!(app.stats(voucher).await["stock"], 0);
    // With the locks on, every buyer's lock was taken.
    assert!(lock_fences(&app).await >= 50);
}

/// The per-user lock is not what keeps one order per user: with it off
/// (`SECKILL_USER_LOCKS=off`), the sale statement and its unique index
/// still sell each user one unit, across two instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_user_locks_the_unique_index_alone_keeps_one_order_per_user() {
    let app = spawn_app_with(|s| seckill::config::Settings {
        user_locks: seckill::config::Switch::Off,
        ..s
    })
    .await;
    two_instance_crowd(&app).await;
    // No lock was taken: a lock leaves its fencing token's key behind.
    assert_eq!(lock_fences(&app).await, 0, "a user's lock was taken");
}

/// 200 users, five purchases each, over `app` and a second instance, for
/// 50 units: exactly the stock sold, once per user. The voucher.
async fn two_instance_crowd(app: &crate::helpers::TestApp) -> i64 {
    let second = app.spawn_instance().await;
    let voucher = app.open_voucher(50).await;
    let tokens = app.tokens(1..=200).await;
    let results = crowd(&[&app.base, &second], &tokens, voucher, 5).await;
    assert_sold_exactly(&results, 50);
    assert_eq!(app.check_invariants(voucher).await, 50);
    voucher
}

/// Fencing-token keys of the users' locks under the app's keyspace: one
/// per user whose lock was ever taken.
async fn lock_fences(app: &crate::helpers::TestApp) -> usize {
    let mut conn = crate::helpers::redis_conn(&crate::helpers::redis_url()).await;
    let pattern = format!("{}*:fence", app.keyspace().await);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut conn)
        .await
        .unwrap();
    keys.len()
}

#[tokio::test]
async fn order_ids_carry_the_creation_second_and_orders_can_be_read_back() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(5).await;
    let tokens = app.tokens([1, 2]).await;
    let before = Utc::now().timestamp();
    let (status, answer) = buy(&app.client, &app.base, &tokens[&1], voucher).await;
    let after = Utc::now().timestamp();
    assert_eq!(status, StatusCode::OK);
    let order_id: OrderId = answer.strip_prefix("ok:").unwrap().parse().unwrap();
    let second = order_id.drawn_at().timestamp();
    assert!(
        (before - 1..=after + 1).contains(&second),
        "id second {second} not in [{before}, {after}]"
    );
    assert!(order_id.sequence() >= 1);

    let get = |token: &str| {
        app.client
            .get(app.url(&format!("/orders/{order_id}")))
            .bearer_auth(token.to_owned())
            .send()
    };
    let own = get(&tokens[&1]).await.unwrap();
    assert_eq!(own.status(), StatusCode::OK);
    let body: Value = own.json().await.unwrap();
    assert_eq!(body["order_id"], order_id.to_string());
    assert_eq!(body["user_id"], 1);
    assert_eq!(body["voucher_id"], voucher);
    let created =
        chrono::DateTime::parse_from_rfc3339(body["created_at"].as_str().unwrap()).unwrap();
    assert!((created.timestamp() - second).abs() <= 1);

    let stranger = get(&tokens[&2]).await.unwrap();
    assert_eq!(stranger.status(), StatusCode::NOT_FOUND);
    let admin = get(ADMIN_TOKEN).await.unwrap();
    assert_eq!(admin.status(), StatusCode::OK);

    // Buying again is refused, and changes nothing.
    let (status, code) = buy(&app.client, &app.base, &tokens[&1], voucher).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::CONFLICT, "already_purchased")
    );
    assert_eq!(app.check_invariants(voucher).await, 1);
}

#[tokio::test]
async fn a_sold_out_voucher_is_refused_without_postgres_until_restocked() {
    // Windows stay cached, so that only the sold-out flag decides.
    let (app, proxy) = spawn_app_behind_pg_proxy(|mut s| {
        s.voucher_cache_ttl = Duration::from_millis(600_000);
        s
    })
    .await;
    let second = app.spawn_instance().await;
    let voucher = app.open_voucher(1).await;
    let tokens = app.tokens([1, 2, 3]).await;

    let (status, _) = buy(&app.client, &app.base, &tokens[&1], voucher).await;
    assert_eq!(status, StatusCode::OK);
    // Warm the other instance's window cache while Postgres is there.
    let (_, code) = buy(&app.client, &second, &tokens[&2], voucher).await;
    assert_eq!(code, "sold_out");

    proxy.cut();
    for base in [&app.base, &second] {
        let (status, code) = buy(&app.client, base, &tokens[&2], voucher).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::CONFLICT, "sold_out"),
            "on {base}"
        );
    }
    proxy.restore();

    let restock = |voucher: i64| {
        app.client
            .post(app.url(&format!("/admin/vouchers/{voucher}/stock")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&serde_json::json!({ "add": 1 }))
            .send()
    };
    let restocked = restock(voucher).await.unwrap();
    assert_eq!(restocked.status(), StatusCode::OK);
    assert_eq!(restocked.json::<Value>().await.unwrap()["stock"], 1);
    // The instance that restocked sells at once.
    let (status, code) = buy(&app.client, &app.base, &tokens[&2], voucher).await;
    assert_eq!(status, StatusCode::OK, "{code}");

    // Another instance trusts its own sight of "sold out" for at most
    // 200 ms (SOLDOUT_LOCAL_TTL); after that it sees the restock too.
    assert_eq!(restock(voucher).await.unwrap().status(), StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let (status, code) = buy(&app.client, &second, &tokens[&3], voucher).await;
    assert_eq!(status, StatusCode::OK, "{code}");
    let stats = app.stats(voucher).await;
    assert_eq!(
        (stats["initial_stock"].as_i64(), stats["stock"].as_i64()),
        (Some(3), Some(0))
    );
    assert_eq!(app.check_invariants(voucher).await, 3);
}
