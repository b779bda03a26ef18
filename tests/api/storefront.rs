//! The storefront's side of the API: the demo's routes (only with
//! `--demo`; the payment goes through the signed notification), the sale
//! monitor's admin route, and the pages served from the binary within
//! their size budget. The pages in a real browser: `tests/api/browser/`.

use std::time::Duration;

use reqwest::header;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{
    answer, buy, notify, poll_until, spawn_app, spawn_app_with, TestApp, ADMIN_TOKEN,
};

/// Every `data-testid` the contract's Pages section names, on the buyer's
/// page and on the monitor.
pub const BUYER_TEST_IDS: [&str; 13] = [
    "voucher-card",
    "sign-in",
    "countdown",
    "stock",
    "join-queue",
    "queue-place",
    "buy",
    "quantity",
    "order-status",
    "pay",
    "cancel",
    "message",
    "data-voucher-id",
];
pub const MONITOR_TEST_IDS: [&str; 9] = [
    "admin-token",
    "monitor-voucher",
    "live-stock",
    "live-orders-per-second",
    "live-serving",
    "live-refusals",
    "live-p99-ms",
    "stock-chart",
    "message",
];

/// The pages and everything they load weigh this much at most, gzipped.
const BUDGET_BYTES: usize = 150 * 1024;

pub async fn spawn_demo() -> TestApp {
    spawn_app_with(|mut s| {
        s.demo = true;
        s
    })
    .await
}

async fn post(app: &TestApp, path: &str, token: Option<&str>) -> (StatusCode, Value) {
    let mut request = app.client.post(app.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    answer(request).await
}

async fn demo_user(app: &TestApp) -> (i64, String) {
    let (status, body) = post(app, "/demo/users", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    (
        body["user_id"].as_i64().unwrap(),
        body["token"].as_str().unwrap().to_owned(),
    )
}

/// Buys one unit of `voucher` with `token`: the order id.
async fn bought(app: &TestApp, token: &str, voucher: i64) -> String {
    let (status, answer) = buy(&app.client, &app.base, token, voucher).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    answer.strip_prefix("ok:").unwrap().to_owned()
}

#[tokio::test]
async fn without_demo_the_demo_routes_are_not_found() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(5).await;
    let token = app.token(7).await;
    let order = bought(&app, &token, voucher).await;
    let (status, body) = post(&app, "/demo/users", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "not_found", "{body}");
    let (status, body) = post(&app, &format!("/demo/orders/{order}/pay"), Some(&token)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "not_found", "{body}");
    // Whatever else the request holds: no token, a malformed id, a body.
    let (status, _) = post(&app, &format!("/demo/orders/{order}/pay"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "without a token");
    let (status, _) = post(&app, "/demo/orders/x/pay", Some(&token)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a malformed id");
    let response = app
        .client
        .post(app.url("/demo/users"))
        .header("content-type", "application/json")
        .body(r#"{"name":"x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND, "with a body");
    let (_, order_now) = app.get_as(&format!("/orders/{order}"), &token).await;
    assert_eq!(order_now["status"], "unpaid");
}

#[tokio::test]
async fn a_demo_user_is_fresh_and_its_token_buys() {
    let app = spawn_demo().await;
    let (first, token) = demo_user(&app).await;
    let (second, _) = demo_user(&app).await;
    assert_ne!(first, second);
    for id in [first, second] {
        // Above any id a load test mints, and exact in JavaScript.
        assert!((1 << 32..1 << 53).contains(&id), "{id}");
    }
    let voucher = app.open_voucher(5).await;
    let order = bought(&app, &token, voucher).await;
    let (status, body) = app.get_as(&format!("/orders/{order}"), &token).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["user_id"], first);
}

#[tokio::test]
async fn the_demo_pays_through_the_signed_notification_and_paying_again_changes_nothing() {
    let app = spawn_demo().await;
    let voucher = app
        .open_voucher_with(3, json!({ "price_cents": 990 }))
        .await;
    let (_, token) = demo_user(&app).await;
    let order = bought(&app, &token, voucher).await;
    let path = format!("/demo/orders/{order}/pay");

    // Another user's order is nobody's to pay.
    let (_, stranger) = demo_user(&app).await;
    let (status, body) = post(&app, &path, Some(&stranger)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, _) = post(&app, &path, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let (status, paid) = post(&app, &path, Some(&token)).await;
    assert_eq!(status, StatusCode::OK, "{paid}");
    assert_eq!(
        paid,
        json!({ "order_id": order, "status": "paid", "refund": false })
    );
    let (_, now) = app.get_as(&format!("/orders/{order}"), &token).await;
    assert_eq!(now["status"], "paid");
    let paid_at = now["paid_at"].clone();
    assert!(paid_at.is_string(), "{now}");

    // Again: the same delivery of the same payment, the same answer.
    let (status, again) = post(&app, &path, Some(&token)).await;
    assert_eq!((status, &again), (StatusCode::OK, &paid));
    // It is the provider's own payment: the provider's delivery of it,
    // signed with the secret, is the same record too.
    let (status, delivered) = notify(
        &app.client,
        &app.base,
        &format!("demo-{order}"),
        &order,
        990,
    )
    .await;
    assert_eq!((status, &delivered), (StatusCode::OK, &paid));
    let (_, after) = app.get_as(&format!("/orders/{order}"), &token).await;
    assert_eq!(after["paid_at"], paid_at);
    let stats = app.stats(voucher).await;
    assert_eq!(
        (stats["paid"].as_i64(), stats["stock"].as_i64()),
        (Some(1), Some(2))
    );
}

#[tokio::test]
async fn the_demo_payment_is_refused_where_the_notification_would_be() {
    // No payment secret: /payments/notify answers 403, and so does the
    // demo's payment, which goes through it.
    let app = spawn_app_with(|mut s| {
        s.demo = true;
        s.payment_secret = None;
        s
    })
    .await;
    let voucher = app.open_voucher(3).await;
    let (_, token) = demo_user(&app).await;
    let order = bought(&app, &token, voucher).await;
    let (status, body) = post(&app, &format!("/demo/orders/{order}/pay"), Some(&token)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    // A cancelled order: the notification's refund, as for any provider.
    let (status, _) = post(&app, &format!("/orders/{order}/cancel"), Some(&token)).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_cancelled_orders_demo_payment_is_recorded_as_a_refund() {
    let app = spawn_demo().await;
    let voucher = app.open_voucher(3).await;
    let (_, token) = demo_user(&app).await;
    let order = bought(&app, &token, voucher).await;
    let (status, _) = post(&app, &format!("/orders/{order}/cancel"), Some(&token)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = post(&app, &format!("/demo/orders/{order}/pay"), Some(&token)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (body["status"].as_str(), body["refund"].as_bool()),
        (Some("cancelled"), Some(true))
    );
}

#[tokio::test]
async fn the_monitor_route_is_the_admins_and_counts_orders_and_refusals_per_second() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(1_000).await;
    let path = format!("/admin/vouchers/{voucher}/monitor");
    let user = app.token(1).await;
    for (token, why) in [("", "no token"), (user.as_str(), "a user's token")] {
        let (status, body) = app.get_as(&path, token).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{why}: {body}");
        assert_eq!(body["error"], "forbidden");
    }
    let (status, body) = app.admin_get("/admin/vouchers/999999/monitor").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );

    // Orders: a purchase by a new user each round, until a reading shows
    // a complete second with orders in it.
    let tokens = app.tokens(100..400).await;
    let mut users = tokens.values();
    let reading = poll_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        "a second with orders",
        || {
            let token = users.next().expect("enough users for a second with orders");
            let (app, path) = (&app, &path);
            async move {
                let _ = buy(&app.client, &app.base, token, voucher).await;
                app.admin_get(path).await.1
            }
        },
        |body| body["orders_per_second"].as_i64() > Some(0),
    )
    .await;
    assert_eq!(reading["voucher_id"], voucher);
    assert_eq!(reading["initial_stock"], 1000);
    let sold = reading["sold"].as_i64().unwrap();
    assert!(sold >= 1, "{reading}");
    assert!(reading["purchase_p99_ms"].as_f64() > Some(0.0), "{reading}");
    assert!(
        reading["purchases_in_window"].as_i64() >= Some(1),
        "{reading}"
    );
    assert_eq!(reading["waiting_room"], Value::Null);

    // Refusals: a user who holds an order asks again, by error code.
    let holder = tokens.values().next().unwrap();
    let reading = poll_until(
        Duration::from_secs(60),
        Duration::from_millis(100),
        "a second with already_purchased refusals",
        || async {
            let _ = buy(&app.client, &app.base, holder, voucher).await;
            app.admin_get(&path).await.1
        },
        |body| body["refusals_per_second"]["already_purchased"].as_i64() > Some(0),
    )
    .await;
    assert_eq!(reading["refusals_per_second"].get("not_found"), None);
    let answer = app
        .client
        .get(app.url(&path))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.headers()[header::CACHE_CONTROL], "no-store");
}

#[tokio::test]
async fn the_monitor_shows_the_waiting_rooms_counter() {
    let app = spawn_app().await;
    let voucher = app
        .open_voucher_with(10, json!({ "waiting_room": { "admit_per_second": 50 } }))
        .await;
    let token = app.token(3).await;
    let (status, _) = post(&app, &format!("/vouchers/{voucher}/queue"), Some(&token)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, body) = app
        .admin_get(&format!("/admin/vouchers/{voucher}/monitor"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let room = &body["waiting_room"];
    assert_eq!(room["admit_per_second"], 50, "{body}");
    assert!(room["placed"].as_i64() >= Some(1), "{body}");
    assert!(room["serving"].as_i64() >= Some(0), "{body}");
}

/// A page or asset: its status, headers and body (as sent: gzipped when
/// asked for with `gzip`).
async fn fetch(app: &TestApp, path: &str, gzip: bool) -> (StatusCode, header::HeaderMap, Vec<u8>) {
    let mut request = app.client.get(app.url(path));
    if gzip {
        request = request.header(header::ACCEPT_ENCODING, "gzip");
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    (status, headers, response.bytes().await.unwrap().to_vec())
}

/// The asset links of a page (`/shop/assets/...?v=...`).
fn asset_links(page: &str) -> Vec<String> {
    page.split("\"/shop/assets/")
        .skip(1)
        .map(|rest| format!("/shop/assets/{}", rest.split('"').next().unwrap()))
        .collect()
}

#[tokio::test]
async fn the_pages_come_from_the_binary_cached_and_within_their_budget() {
    let app = spawn_app().await;
    let mut gzipped = 0;
    let mut text = String::new();
    let mut links = Vec::new();
    for path in ["/shop/", "/shop/vouchers/3", "/shop/monitor"] {
        let (status, headers, _) = fetch(&app, path, true).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(headers[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(headers[header::CONTENT_ENCODING], "gzip");
        let policy = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(policy.starts_with("default-src 'self'"), "{policy}");
        let (_, plain_headers, plain) = fetch(&app, path, false).await;
        assert!(plain_headers.get(header::CONTENT_ENCODING).is_none());
        let page = String::from_utf8(plain).unwrap();
        assert!(page.contains("data-demo=\"false\"") || path == "/shop/monitor");
        links.extend(asset_links(&page));
        text.push_str(&page);
    }
    links.sort();
    links.dedup();
    assert_eq!(links.len(), 4, "{links:?}");
    for link in &links {
        let (status, headers, body) = fetch(&app, link, true).await;
        assert_eq!(status, StatusCode::OK, "{link}");
        let kind = headers[header::CONTENT_TYPE].to_str().unwrap();
        let expected = if link.contains(".css") {
            "text/css"
        } else {
            "text/javascript"
        };
        assert!(kind.starts_with(expected), "{link}: {kind}");
        assert!(headers[header::CACHE_CONTROL]
            .to_str()
            .unwrap()
            .contains("immutable"));
        gzipped += body.len();
        let (_, _, plain) = fetch(&app, link, false).await;
        text.push_str(&String::from_utf8(plain).unwrap());
    }
    // The two pages once each (the voucher's page is the buyer's).
    for path in ["/shop/", "/shop/monitor"] {
        gzipped += fetch(&app, path, true).await.2.len();
    }
    assert!(gzipped < BUDGET_BYTES, "{gzipped} bytes gzipped");
    for name in BUYER_TEST_IDS.iter().chain(&MONITOR_TEST_IDS) {
        assert!(text.contains(name), "no {name}");
    }

    // Cached: a 304 to the page's own tag; an unknown asset is not_found.
    let (_, headers, _) = fetch(&app, "/shop/", false).await;
    let tag = headers[header::ETAG].to_str().unwrap().to_owned();
    assert_eq!(headers[header::CACHE_CONTROL], "no-cache");
    let response = app
        .client
        .get(app.url("/shop/"))
        .header(header::IF_NONE_MATCH, &tag)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
    let (status, _, body) = fetch(&app, "/shop/assets/nope.js", false).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"], "not_found");
    // Addresses no page can read are refused in JSON like any error; a
    // voucher's page is the buyer's page whatever its address holds.
    for path in [
        "/docs/%FF",
        "/shop/assets/%FF",
        "/shop/assets/shop.js?v=1&v=2",
    ] {
        let (status, headers, body) = fetch(&app, path, false).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(headers[header::CONTENT_TYPE], "application/json", "{path}");
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"], "bad_request", "{path}");
    }
    let (status, _, _) = fetch(&app, "/shop/vouchers/%FF", false).await;
    assert_eq!(status, StatusCode::OK);
    let response = app.client.get(app.url("/shop")).send().await.unwrap();
    assert_eq!(
        response.url().path(),
        "/shop/",
        "followed to the storefront"
    );
}

#[tokio::test]
async fn the_demo_page_offers_sign_in_and_the_new_routes_are_described() {
    let app = spawn_demo().await;
    let (_, _, page) = fetch(&app, "/shop/", false).await;
    assert!(String::from_utf8(page)
        .unwrap()
        .contains("data-demo=\"true\""));
    let (status, document) = answer(app.client.get(app.url("/openapi.json"))).await;
    assert_eq!(status, StatusCode::OK);
    let paths = document["paths"].as_object().unwrap();
    for path in [
        "/demo/users",
        "/demo/orders/{order_id}/pay",
        "/admin/vouchers/{id}/monitor",
    ] {
        assert!(paths.contains_key(path), "{path} is not described");
    }
    assert!(
        !paths.keys().any(|path| path.starts_with("/shop")),
        "the pages are no API"
    );
}
