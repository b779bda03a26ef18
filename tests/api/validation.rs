//! Every kind of bad input gets the contract's status and error code, and
//! changes nothing.

use chrono::{Duration, Utc};
use reqwest::{Method, StatusCode};
use seckill::token::TokenSigner;
use serde_json::{json, Value};

use crate::helpers::{answer, buy, spawn_app, TestApp, ADMIN_TOKEN, TOKEN_SECRET};

/// A request: method, path, `Authorization` header and body (sent as
/// JSON).
type Call<'a> = (Method, &'a str, Option<&'a str>, Option<&'a str>);

/// The status and error code a refused request gets.
type Refusal = (StatusCode, &'static str);

const BAD_REQUEST: Refusal = (StatusCode::BAD_REQUEST, "bad_request");
const UNAUTHORIZED: Refusal = (StatusCode::UNAUTHORIZED, "unauthorized");
const FORBIDDEN: Refusal = (StatusCode::FORBIDDEN, "forbidden");
const NOT_FOUND: Refusal = (StatusCode::NOT_FOUND, "not_found");
const METHOD_NOT_ALLOWED: Refusal = (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");

/// POSTs each body to `path` as `auth`: every one is `400 bad_request`.
async fn refuse_all(app: &TestApp, path: &str, auth: &str, bodies: &[impl AsRef<str>]) {
    for body in bodies {
        let call = (Method::POST, path, Some(auth), Some(body.as_ref()));
        expect(app, call, BAD_REQUEST).await;
    }
}

/// Sends a request and asserts the status and the JSON error code.
async fn expect(app: &TestApp, call: Call<'_>, (status, code): Refusal) {
    let (method, path, auth, body) = call;
    let mut request = app.client.request(method.clone(), app.url(path));
    if let Some(auth) = auth {
        request = request.header("Authorization", auth);
    }
    if let Some(body) = body {
        request = request
            .header("Content-Type", "application/json")
            .body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    let got = response.status();
    let text = response.text().await.unwrap();
    let json: Value = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("{method} {path}: not JSON: {text:?}"));
    assert_eq!(got, status, "{method} {path} {body:?}: {text}");
    assert_eq!(json["error"], code, "{method} {path} {body:?}: {text}");
    assert!(
        json["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{text}"
    );
}

/// An app with a voucher of 5 units on sale, and the app's snapshot
/// before any bad input.
async fn app_with_a_voucher() -> (TestApp, i64, (i64, i64, i64, i64)) {
    let app = spawn_app().await;
    let voucher = app.open_voucher(5).await;
    let before = app.snapshot().await;
    (app, voucher, before)
}

#[tokio::test]
async fn the_time_window_and_unknown_vouchers_are_refused() {
    let app = spawn_app().await;
    let now = Utc::now();
    let later = app
        .create_voucher(5, now + Duration::hours(1), now + Duration::hours(2))
        .await;
    let over = app
        .create_voucher(5, now - Duration::hours(2), now - Duration::hours(1))
        .await;
    let token = app.token(1).await;
    let before = app.snapshot().await;

    assert_eq!(
        buy(&app.client, &app.base, &token, later).await,
        (StatusCode::CONFLICT, "not_started".into())
    );
    assert_eq!(
        buy(&app.client, &app.base, &token, over).await,
        (StatusCode::CONFLICT, "ended".into())
    );
    assert_eq!(
        buy(&app.client, &app.base, &token, 999_999).await,
        (StatusCode::NOT_FOUND, "not_found".into())
    );
    let bearer = format!("Bearer {token}");
    let admin = format!("Bearer {ADMIN_TOKEN}");
    for (path, auth) in [
        ("/vouchers/999999", None),
        ("/admin/vouchers/999999/orders", Some(admin.as_str())),
        ("/admin/vouchers/999999/stats", Some(admin.as_str())),
        ("/orders/123456789", Some(bearer.as_str())),
    ] {
        expect(&app, (Method::GET, path, auth, None), NOT_FOUND).await;
    }

    assert_eq!(app.snapshot().await, before);
    assert_eq!(app.stats(later).await["stock"], 5);
}

#[tokio::test]
async fn malformed_ids_tokens_and_headers_are_refused() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(5).await;
    let token = app.token(1).await;
    let bearer = format!("Bearer {token}");
    let before = app.snapshot().await;

    for id in [
        "abc",
        "0",
        "-1",
        "01",
        "1.5",
        "+1",
        "99999999999999999999",
        "%20",
        "1%00",
    ] {
        let cases = [
            (Method::POST, "seckill", Some(bearer.as_str())),
            (Method::GET, "vouchers", None),
            (Method::GET, "orders", Some(bearer.as_str())),
        ];
        for (method, route, auth) in cases {
            let path = format!("/{route}/{id}");
            expect(&app, (method, &path, auth, None), BAD_REQUEST).await;
        }
    }

    let forged = TokenSigner::new(b"not the secret").sign(1, Utc::now().timestamp() + 600);
    let expired = TokenSigner::new(TOKEN_SECRET.as_bytes()).sign(1, Utc::now().timestamp() - 1);
    let tampered = token.replacen("v1.1.", "v1.2.", 1);
    let path = format!("/seckill/{voucher}");
    for auth in [
        None,
        Some(String::new()),
        Some("Bearer".into()),
        Some("Bearer ".into()),
        Some(format!("Basic {token}")),
        Some(format!("Bearer {token} extra")),
        Some("Bearer not-a-token".into()),
        Some("Bearer v1.1.2.3".into()),
        Some(format!("Bearer {forged}")),
        Some(format!("Bearer {expired}")),
        Some(format!("Bearer {tampered}")),
        Some(format!("Bearer {ADMIN_TOKEN}")),
    ] {
        let call = (Method::POST, path.as_str(), auth.as_deref(), None);
        expect(&app, call, UNAUTHORIZED).await;
    }

    // Admin routes take the admin token and nothing else.
    let stats = format!("/admin/vouchers/{voucher}/stats");
    let admin_routes = [
        (Method::POST, "/admin/vouchers", Some("{}")),
        (Method::POST, "/admin/tokens", Some(r#"{"user_ids":[1]}"#)),
        (Method::GET, stats.as_str(), None),
    ];
    for auth in [
        None,
        Some(bearer.clone()),
        Some("Bearer wrong".into()),
        Some(format!("bearer{ADMIN_TOKEN}")),
    ] {
        for (method, path, body) in admin_routes.clone() {
            expect(&app, (method, path, auth.as_deref(), body), FORBIDDEN).await;
        }
    }

    expect(&app, (Method::GET, "/no/such/route", None, None), NOT_FOUND).await;
    let delete = (Method::DELETE, path.as_str(), Some(bearer.as_str()), None);
    expect(&app, delete, METHOD_NOT_ALLOWED).await;

    assert_eq!(app.snapshot().await, before);
}

#[tokio::test]
async fn malformed_bodies_are_refused() {
    let (app, voucher, before) = app_with_a_voucher().await;
    let admin = format!("Bearer {ADMIN_TOKEN}");
    let begin = Utc::now().to_rfc3339();
    let end = (Utc::now() + Duration::hours(1)).to_rfc3339();
    let voucher_with = |field: &str, value: Value| {
        let mut body = json!({ "title": "t", "stock": 5, "begin_time": begin, "end_time": end });
        body[field] = value;
        body.to_string()
    };

    let bad_vouchers = vec![
        String::new(),
        "not json".into(),
        "[]".into(),
        "{}".into(),
        r#"{"title":"t"}"#.into(),
        voucher_with("stock", json!(-1)),
        voucher_with("stock", json!(2_147_483_648_i64)),
        voucher_with("stock", json!("5")),
        voucher_with("stock", json!(1.5)),
        voucher_with("title", json!("")),
        voucher_with("title", json!("   ")),
        voucher_with("title", json!("x".repeat(201))),
        voucher_with("title", json!(null)),
        voucher_with("begin_time", json!("yesterday")),
        voucher_with("begin_time", json!("2026-01-01 10:00:00")),
        voucher_with("end_time", json!(begin)),
        voucher_with(
            "end_time",
            json!((Utc::now() - Duration::hours(1)).to_rfc3339()),
        ),
        voucher_with("extra", json!(1)),
        // A struct's fields as an array: serde would read it, the API must not.
        json!(["t", 5, begin, end]).to_string(),
        // A key given twice (read through a map, the last one won unseen).
        format!(
            r#"{{"title":"t","stock":-1,"stock":5,"begin_time":"{begin}","end_time":"{end}"}}"#
        ),
    ];
    refuse_all(&app, "/admin/vouchers", &admin, &bad_vouchers).await;

    let too_many: Vec<i64> = (1..=10_001).collect();
    refuse_all(
        &app,
        "/admin/tokens",
        &admin,
        &[
            r#"{"user_ids":[]}"#.to_owned(),
            r#"{"user_ids":[0]}"#.to_owned(),
            r#"{"user_ids":[-5]}"#.to_owned(),
            // The first id drawn for a shop's non-numeric subject.
            r#"{"user_ids":[9007199254740992]}"#.to_owned(),
            r#"{"user_ids":["1"]}"#.to_owned(),
            r#"{"user_ids":[1],"ttl_seconds":0}"#.to_owned(),
            r#"{"users":[1]}"#.to_owned(),
            r#"[[1]]"#.to_owned(),
            json!({ "user_ids": too_many }).to_string(),
        ],
    )
    .await;

    let restock = format!("/admin/vouchers/{voucher}/stock");
    refuse_all(
        &app,
        &restock,
        &admin,
        &[
            r#"{"add":0}"#,
            r#"{"add":-1}"#,
            r#"{"add":2147483647}"#,
            r#"{}"#,
            r#"[2]"#,
            r#"{"add":-1,"add":2}"#,
        ],
    )
    .await;
    let buyer = format!("Bearer {}", app.tokens([1]).await[&1]);
    refuse_all(
        &app,
        &format!("/seckill/{voucher}"),
        &buyer,
        &[
            r#"{"quantity":1,"quantity":1}"#,
            r#"[1]"#,
            r#"{"quantity":1.0}"#,
        ],
    )
    .await;

    // A JSON body without its content type is refused as well.
    let response = app
        .client
        .post(app.url("/admin/vouchers"))
        .header("Authorization", &admin)
        .body(voucher_with("stock", json!(5)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);

    assert_eq!(app.snapshot().await, before);
}

#[tokio::test]
async fn health_readiness_and_metrics_answer() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(1).await;
    let token = app.token(1).await;
    buy(&app.client, &app.base, &token, voucher).await;

    for path in ["/healthz", "/readyz"] {
        let response = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    let metrics = app.metrics().await;
    for needle in [
        "http_requests_total{route=\"/seckill/{voucher_id}\",method=\"POST\",status=\"200\"}",
        "seckill_purchases_total{outcome=\"ordered\"}",
        "seckill_lock_acquire_seconds_bucket",
        "seckill_pool_connections{pool=\"postgres\",state=\"open\"}",
    ] {
        assert!(
            metrics.contains(needle),
            "metrics lack {needle}:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn times_titles_and_headers_that_once_slipped_through_are_refused() {
    let (app, voucher, before) = app_with_a_voucher().await;
    let admin = format!("Bearer {ADMIN_TOKEN}");
    let voucher_with = |begin: &str, end: &str, title: &str| {
        json!({ "title": title, "stock": 5, "begin_time": begin, "end_time": end }).to_string()
    };
    let good_begin = "2030-01-01T00:00:00Z";
    let good_end = "2030-01-02T00:00:00Z";
    let bad = [
        voucher_with(good_begin, good_end, "nul \u{0} inside"),
        voucher_with(good_begin, good_end, "bell \u{7}"),
        // Over 200 characters as sent, even if trimming would bring it to 200.
        voucher_with(good_begin, good_end, &format!("\t{}", "*".repeat(200))),
        voucher_with(good_begin, good_end, &format!(" {} ", "*".repeat(200))),
        // Less than a microsecond apart: equal once Postgres keeps them.
        voucher_with(
            "2030-01-01T00:00:00.0000001Z",
            "2030-01-01T00:00:00.0000009Z",
            "t",
        ),
        voucher_with("2026-01-01 00:00:00Z", good_end, "t"),
        voucher_with("2026-01-01T00:00:00+0530", good_end, "t"),
        voucher_with(" 2026-01-01T00:00:00Z", good_end, "t"),
        voucher_with("2026-01-01T00:00:00Z ", good_end, "t"),
        voucher_with("+12026-01-01T00:00:00Z", "+12026-01-02T00:00:00Z", "t"),
        // 9999-12-31T23:59:59-12:00 is in year 10000 in UTC, which RFC 3339
        // cannot write back.
        voucher_with(good_begin, "9999-12-31T23:59:59-12:00", "t"),
    ];
    refuse_all(&app, "/admin/vouchers", &admin, &bad).await;

    // The latest time that can be written back round-trips exactly.
    let response = app
        .client
        .post(app.url("/admin/vouchers"))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/json")
        .body(voucher_with(good_begin, "9999-12-31T23:59:59+00:00", "t"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let id = response.json::<Value>().await.unwrap()["id"]
        .as_i64()
        .unwrap();
    let stored: Value = app
        .client
        .get(app.url(&format!("/vouchers/{id}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stored["end_time"], "9999-12-31T23:59:59Z");
    let after_create = app.snapshot().await;

    // Two Authorization headers: which caller is this? Refused.
    let tokens = app.tokens([1, 2]).await;
    let purchase = || app.client.post(app.url(&format!("/seckill/{voucher}")));
    let (status, body) = answer(
        purchase()
            .header("Authorization", format!("Bearer {}", tokens[&2]))
            .header("Authorization", format!("Bearer {}", tokens[&1])),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request"))
    );

    // A purchase takes no body: a large one is 413, any other 400.
    let token = format!("Bearer {}", tokens[&1]);
    let huge = "x".repeat(3 * 1024 * 1024);
    let (status, body) = answer(purchase().header("Authorization", &token).body(huge)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("payload_too_large"))
    );
    let (status, _) = answer(
        purchase()
            .header("Authorization", &token)
            .header("Content-Type", "text/plain")
            .body("buy it"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        app.snapshot().await,
        after_create,
        "a refused request changed data"
    );
    assert_ne!(before, after_create);

    // What is echoed is bounded: a 60 KB id, an 8 KB request id.
    let long_id = "9".repeat(60_000);
    let response = app
        .client
        .get(app.url(&format!("/vouchers/{long_id}")))
        .header("x-request-id", "r".repeat(8_192))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let echoed = response.headers()["x-request-id"].len();
    assert!(echoed <= 64, "an {echoed}-byte request id came back");
    let text = response.text().await.unwrap();
    assert!(text.len() < 1_024, "a {}-byte answer", text.len());
}
