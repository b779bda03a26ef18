//! Units: "limit N per customer". A purchase asks for 1 to the voucher's
//! `max_units_per_user` units and gets them all or none, in sync and async
//! sales alike; a cancel gives them all back once; a payment brings the
//! price times the quantity; the books count units.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::task::JoinSet;

use crate::helpers::{answer, notify, poll_until, spawn_app, spawn_app_on_own_redis, TestApp};

/// Sends a purchase of `voucher` as `token`'s user with `body` (none: no
/// body at all); the status and the JSON answer.
async fn buy_with(
    app: &TestApp,
    token: &str,
    voucher: i64,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let request = app
        .client
        .post(app.url(&format!("/seckill/{voucher}")))
        .bearer_auth(token);
    let request = match body {
        Some(body) => request.json(&body),
        None => request,
    };
    answer(request).await
}

/// A purchase of `units` units.
async fn buy_units(app: &TestApp, token: &str, voucher: i64, units: i64) -> (StatusCode, Value) {
    buy_with(app, token, voucher, Some(json!({ "quantity": units }))).await
}

/// A voucher in `mode` on sale now with `stock` units, at most `max_units`
/// per order, at `price` cents a unit.
async fn units_voucher(app: &TestApp, mode: &str, stock: i64, max_units: i64, price: i64) -> i64 {
    app.open_voucher_with(
        stock,
        json!({ "sale_mode": mode, "max_units_per_user": max_units, "price_cents": price }),
    )
    .await
}

/// The order as its user sees it, once stored (an async order is pending
/// until the writer has stored it).
async fn stored_order(app: &TestApp, order_id: &str) -> Value {
    poll_until(
        Duration::from_secs(30),
        Duration::from_millis(50),
        "the order is stored",
        || async { app.admin_get(&format!("/orders/{order_id}")).await },
        |(status, body)| *status == StatusCode::OK && body["status"] != "pending",
    )
    .await
    .1
}

fn order_of(body: &Value) -> String {
    body["order_id"].as_str().expect("an order id").to_owned()
}

/// Whether a purchase went through: `200` in a sync sale, `202` in async.
fn bought(status: StatusCode) -> bool {
    status == StatusCode::OK || status == StatusCode::ACCEPTED
}

#[tokio::test]
async fn a_voucher_says_how_many_units_an_order_may_take_and_a_quantity_outside_it_is_refused() {
    let app = spawn_app().await;
    let plain = app.open_voucher(10).await;
    let (_, body) = answer(app.client.get(app.url(&format!("/vouchers/{plain}")))).await;
    assert_eq!(body["max_units_per_user"], 1, "{body}");
    let three = units_voucher(&app, "sync", 10, 3, 0).await;
    let (_, body) = answer(app.client.get(app.url(&format!("/vouchers/{three}")))).await;
    assert_eq!(body["max_units_per_user"], 3, "{body}");

    // A voucher allows 1 to 100 units per order.
    for max_units in [json!(0), json!(101), json!(-1), json!("2"), json!(1.5)] {
        let now = chrono::Utc::now();
        let body = json!({
            "title": "t", "stock": 5, "max_units_per_user": max_units,
            "begin_time": now, "end_time": now + chrono::Duration::hours(1),
        });
        let request = app
            .client
            .post(app.url("/admin/vouchers"))
            .bearer_auth(crate::helpers::ADMIN_TOKEN)
            .json(&body);
        let (status, answer) = answer(request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{max_units}: {answer}");
    }

    let token = app.token(1).await;
    let before = app.snapshot().await;
    for (voucher, body) in [
        (three, json!({ "quantity": 4 })),
        (three, json!({ "quantity": 0 })),
        (three, json!({ "quantity": -2 })),
        (three, json!({ "quantity": "2" })),
        (three, json!({ "quantity": null })),
        (three, json!({ "units": 2 })),
        (three, json!([2])),
        (plain, json!({ "quantity": 2 })),
    ] {
        let (status, answer) = buy_with(&app, &token, voucher, Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"], "bad_request", "{body}");
    }
    let raw = app
        .client
        .post(app.url(&format!("/seckill/{three}")))
        .bearer_auth(&token)
        .body("quantity=2");
    assert_eq!(answer(raw).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(
        app.snapshot().await,
        before,
        "a refused quantity changed data"
    );

    // No body, an empty one, `{}`, or one unit: one unit, as before units.
    let (status, body) = buy_with(&app, &token, plain, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let order = stored_order(&app, &order_of(&body)).await;
    assert_eq!(order["quantity"], 1, "{order}");
    let other = app.token(2).await;
    let empty = app
        .client
        .post(app.url(&format!("/seckill/{plain}")))
        .bearer_auth(&other)
        .header("content-type", "application/json")
        .body("");
    assert_eq!(answer(empty).await.0, StatusCode::OK);
    assert_eq!(
        buy_units(&app, &app.token(3).await, plain, 1).await.0,
        StatusCode::OK
    );
    let (status, body) = buy_with(&app, &app.token(4).await, plain, Some(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(stored_order(&app, &order_of(&body)).await["quantity"], 1);
    assert_eq!(app.check_invariants(plain).await, 4);
    // A buyer who holds an order is told so, but a quantity no voucher
    // allows is bad input first.
    let (status, body) = buy_units(&app, &token, plain, 1).await;
    assert_eq!(body["error"], "already_purchased", "{status} {body}");
    let (status, body) = buy_units(&app, &token, plain, 0).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // So is one this voucher does not allow, on an instance that knows
    // the buyer holds an order as on one that does not (it answered
    // already_purchased).
    let (status, body) = buy_units(&app, &token, plain, 2).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"], "bad_request", "{body}");
}

/// The same story in both modes: all or nothing, `not_enough_stock` with
/// what is left, `sold_out` only when nothing is, a cancel giving every
/// unit back once.
async fn all_or_nothing(mode: &str) {
    let app = spawn_app().await;
    let voucher = units_voucher(&app, mode, 3, 3, 0).await;
    let tokens = app.tokens(1..=3).await;

    let (status, body) = buy_units(&app, &tokens[&1], voucher, 2).await;
    assert!(bought(status), "{mode}: {status} {body}");
    let first = order_of(&body);
    let (status, body) = buy_units(&app, &tokens[&2], voucher, 2).await;
    assert_eq!(status, StatusCode::CONFLICT, "{mode}: {body}");
    assert_eq!(body["error"], "not_enough_stock", "{mode}: {body}");
    assert_eq!(body["stock"], 1, "{mode}: the units left: {body}");
    let (status, body) = buy_units(&app, &tokens[&2], voucher, 1).await;
    assert!(
        bought(status),
        "{mode}: asking again for fewer: {status} {body}"
    );
    let second = order_of(&body);
    let (status, body) = buy_units(&app, &tokens[&3], voucher, 1).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("sold_out")),
        "{mode}: {body}"
    );

    let order = stored_order(&app, &first).await;
    assert_eq!(
        (order["quantity"].as_i64(), order["status"].as_str()),
        (Some(2), Some("unpaid"))
    );
    assert_eq!(stored_order(&app, &second).await["quantity"], 1);
    let stats = app.stats(voucher).await;
    assert_eq!(
        (
            stats["units"].as_i64(),
            stats["orders"].as_i64(),
            stats["stock"].as_i64()
        ),
        (Some(3), Some(2), Some(0)),
        "{mode}: {stats}"
    );
    assert_eq!(app.check_invariants(voucher).await, 2);

    // A cancel gives both units back, once: a second cancel changes nothing.
    for _ in 0..2 {
        let cancel = app
            .client
            .post(app.url(&format!("/orders/{first}/cancel")))
            .bearer_auth(&tokens[&1]);
        let (status, body) = answer(cancel).await;
        assert_eq!(status, StatusCode::OK, "{mode}: {body}");
        assert_eq!(
            (body["status"].as_str(), body["quantity"].as_i64()),
            (Some("cancelled"), Some(2))
        );
    }
    let stats = app.stats(voucher).await;
    assert_eq!(
        (stats["units"].as_i64(), stats["stock"].as_i64()),
        (Some(1), Some(2)),
        "{stats}"
    );
    // Both units are for sale again (in async, once Redis has them back).
    let (status, body) = poll_until(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "the returned units are on sale again",
        || buy_units(&app, &tokens[&3], voucher, 2),
        |(status, _)| bought(*status),
    )
    .await;
    stored_order(&app, &order_of(&body)).await;
    assert!(bought(status));
    let (status, body) = buy_units(&app, &tokens[&1], voucher, 1).await;
    assert_eq!(body["error"], "sold_out", "{mode}: {status} {body}");
    assert_eq!(app.check_invariants(voucher).await, 2);
}

#[tokio::test]
async fn a_sync_sale_sells_units_all_or_nothing_and_a_cancel_gives_them_all_back() {
    all_or_nothing("sync").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_sale_sells_units_all_or_nothing_and_a_cancel_gives_them_all_back() {
    all_or_nothing("async").await;
}

#[tokio::test]
async fn a_payment_brings_the_price_times_the_quantity_and_the_events_carry_the_units() {
    let app = spawn_app().await;
    let voucher = units_voucher(&app, "sync", 10, 5, 250).await;
    let token = app.token(7).await;
    let (status, body) = buy_units(&app, &token, voucher, 3).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let order = order_of(&body);
    let (status, body) = notify(&app.client, &app.base, "pay-one-unit", &order, 250).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "one unit's price: {body}");
    let (status, body) = notify(&app.client, &app.base, "pay-three", &order, 750).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (body["status"].as_str(), body["refund"].as_bool()),
        (Some("paid"), Some(false))
    );

    // An event shows in the feed once every older transaction has ended.
    let events = poll_until(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "both events of the order in the feed",
        || async {
            let (status, feed) = app.admin_get("/admin/events?limit=100").await;
            assert_eq!(status, StatusCode::OK, "{feed}");
            feed["events"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["order"]["order_id"] == order.as_str())
                .map(|e| {
                    let kind = e["type"].as_str().unwrap().to_owned();
                    (kind, e["order"]["quantity"].as_i64().unwrap())
                })
                .collect::<Vec<(String, i64)>>()
        },
        |events| events.len() >= 2,
    )
    .await;
    assert_eq!(
        events,
        [
            ("order.created".to_owned(), 3),
            ("order.paid".to_owned(), 3)
        ]
    );
}

/// A crowd asking for 1 to 3 units each, all at once: every unit sold once,
/// nobody served part of an ask, `not_enough_stock` only with fewer units
/// left than asked.
async fn mixed_crowd(mode: &str) {
    let app = spawn_app().await;
    let stock = 101;
    let voucher = units_voucher(&app, mode, stock, 3, 0).await;
    let users: Vec<i64> = (1..=150).collect();
    let tokens = app.tokens(users.iter().copied()).await;
    let ask = |user: i64| user % 3 + 1;
    let mut crowd = JoinSet::new();
    for &user in &users {
        let (client, url, token) = (
            app.client.clone(),
            app.url(&format!("/seckill/{voucher}")),
            tokens[&user].clone(),
        );
        crowd.spawn(async move {
            let request = client
                .post(url)
                .bearer_auth(token)
                .json(&json!({ "quantity": ask(user) }));
            (user, answer(request).await)
        });
    }
    let mut served: HashMap<String, i64> = HashMap::new();
    while let Some(done) = crowd.join_next().await {
        let (user, (status, body)) = done.unwrap();
        match (status, body["error"].as_str()) {
            (status, _) if bought(status) => {
                served.insert(order_of(&body), ask(user));
            }
            (StatusCode::CONFLICT, Some("sold_out")) => {}
            (StatusCode::CONFLICT, Some("not_enough_stock")) => {
                let left = body["stock"].as_i64().unwrap();
                assert!(
                    0 < left && left < ask(user),
                    "{mode}: {left} left, {} asked",
                    ask(user)
                );
            }
            other => panic!("{mode}: user {user}: {other:?} {body}"),
        }
    }
    for (order, units) in &served {
        let stored = stored_order(&app, order).await;
        assert_eq!(
            stored["quantity"].as_i64(),
            Some(*units),
            "{mode}: part of an ask: {stored}"
        );
    }
    let sold: i64 = served.values().sum();
    let stats = app.stats(voucher).await;
    assert_eq!(stats["units"].as_i64(), Some(sold), "{mode}: {stats}");
    assert_eq!(
        stats["stock"].as_i64(),
        Some(stock - sold),
        "{mode}: {stats}"
    );
    // The stock only fell, and every ask is 3 at most: with 3 or more left
    // at the end, no ask could have been refused, yet 300 were made of 101.
    assert!(
        stock - sold < 3,
        "{mode}: {} units left unsold",
        stock - sold
    );
    assert_eq!(app.check_invariants(voucher).await, served.len() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_crowd_asking_for_one_to_three_units_sells_every_unit_once() {
    mixed_crowd("sync").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_crowd_asking_for_one_to_three_units_sells_every_unit_once() {
    mixed_crowd("async").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciliation_after_redis_lost_the_sale_counts_the_orders_units_not_their_number() {
    let (mut redis, app) = spawn_app_on_own_redis(None).await;
    let voucher = units_voucher(&app, "async", 10, 3, 0).await;
    let tokens = app.tokens(1..=5).await;
    let mut orders = Vec::new();
    for (user, units) in [(1, 3), (2, 3), (3, 2)] {
        let (status, body) = buy_units(&app, &tokens[&user], voucher, units).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        orders.push(order_of(&body));
    }
    for order in &orders {
        stored_order(&app, order).await;
    }

    // Redis comes back empty: rebuilt from Postgres, 8 of 10 units sold.
    let report = app.reconcile_after_empty_redis(&mut redis, voucher).await;
    assert_eq!(
        (report["stock"].as_i64(), report["buyers"].as_i64()),
        (Some(2), Some(3)),
        "{report}"
    );
    let (status, body) = buy_units(&app, &tokens[&4], voucher, 3).await;
    assert_eq!(
        (status, body["error"].as_str(), body["stock"].as_i64()),
        (StatusCode::CONFLICT, Some("not_enough_stock"), Some(2)),
        "{body}"
    );
    let (status, body) = buy_units(&app, &tokens[&4], voucher, 2).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    stored_order(&app, &order_of(&body)).await;
    let (_, body) = buy_units(&app, &tokens[&5], voucher, 1).await;
    assert_eq!(body["error"], "sold_out", "{body}");
    assert_eq!(app.check_invariants(voucher).await, 4);
}
