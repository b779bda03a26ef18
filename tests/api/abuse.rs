//! What one client may not do to the others: go past its rate limits, hold
//! places with duplicates of one token, hold units for free, trickle a
//! body, use the payment route without a signature, reuse a payment id;
//! and secrets that would let anyone in.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{
    answer, assert_refused_to_start, buy, send_purchase, settings, spawn_app_with, TestApp,
    PAYMENT_SECRET,
};
use seckill::startup::Application;

/// How long the limited apps hold a refusal.
const REFUSAL_DELAY: Duration = Duration::from_millis(300);

/// An app whose limits trust 127.0.0.1 as a proxy: each test names its
/// clients by `X-Forwarded-For`.
async fn limited_app(per_address: u32, per_user: u32) -> TestApp {
    spawn_app_with(|mut s| {
        s.limit_per_address = per_address;
        s.limit_per_user = per_user;
        s.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        s.limit_delay = REFUSAL_DELAY;
        s
    })
    .await
}

async fn healthz_from(app: &TestApp, client: &str) -> reqwest::Response {
    app.client
        .get(app.url("/healthz"))
        .header("x-forwarded-for", client)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_address_over_its_limit_is_refused_with_retry_after_and_others_are_not() {
    let app = limited_app(3, 0).await;
    for _ in 0..3 {
        assert_eq!(
            healthz_from(&app, "198.51.100.1").await.status(),
            StatusCode::OK
        );
    }
    let asked = Instant::now();
    let refused = healthz_from(&app, "198.51.100.1").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // Held before it is sent: a script that asks again at once is slowed.
    assert!(asked.elapsed() >= REFUSAL_DELAY, "{:?}", asked.elapsed());
    let wait: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=1).contains(&wait), "Retry-After {wait}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "rate_limited", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("this client"),
        "{body}"
    );
    // Another client behind the same proxy has its own allowance; so has
    // the proxy itself, for what it sends without the header.
    assert_eq!(
        healthz_from(&app, "198.51.100.2").await.status(),
        StatusCode::OK
    );
    let direct = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(direct.status(), StatusCode::OK);
    // A client cannot pick another allowance by writing the header itself:
    // only the last hop, the proxy's, counts.
    let spoofed = app
        .client
        .get(app.url("/healthz"))
        .header("x-forwarded-for", "203.0.113.9, 198.51.100.1")
        .send()
        .await
        .unwrap();
    assert_eq!(spoofed.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        app.metrics()
            .await
            .lines()
            .any(|l| l.starts_with("seckill_rate_limited_total{")
                && l.contains("class=\"ops\"")
                && l.contains("limit=\"address\"")
                && !l.ends_with(" 0")),
        "the refusals are counted by route class"
    );
}

#[tokio::test]
async fn a_user_over_their_limit_is_refused_and_other_users_are_not() {
    let app = limited_app(0, 2).await;
    let voucher = app.open_voucher(10).await;
    let tokens = app.tokens([1, 2]).await;
    let order = |token: &str| {
        let (client, url, token) = (app.client.clone(), app.url("/orders/1"), token.to_owned());
        async move { answer(client.get(url).bearer_auth(token)).await }
    };
    // Two requests of the burst (an unknown order is 404: the limit is
    // about requests, not answers), then the third is refused.
    assert_eq!(order(&tokens[&1]).await.0, StatusCode::NOT_FOUND);
    assert_eq!(order(&tokens[&1]).await.0, StatusCode::NOT_FOUND);
    let (status, body) = order(&tokens[&1]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"], "rate_limited");
    // The refusal names the user's limit, not the client address's.
    assert!(
        body["message"].as_str().unwrap().contains("this user"),
        "{body}"
    );
    // Its purchases too: the user's allowance covers every user route.
    let (status, code) = buy(&app.client, &app.base, &tokens[&1], voucher).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "rate_limited")
    );
    // Another user buys.
    let (status, code) = buy(&app.client, &app.base, &tokens[&2], voucher).await;
    assert_eq!(status, StatusCode::OK, "{code}");
    // A token that signs nobody in is 401, as the limiter's verification
    // found (the route takes its answer, it does not verify again), and
    // uses no user's allowance: user 2's token, made out to user 3.
    let mut forged: Vec<&str> = tokens[&2].split('.').collect();
    forged[1] = "3";
    let forged = forged.join(".");
    for _ in 0..3 {
        let (status, body) = app.post_as(&format!("/seckill/{voucher}"), &forged).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        assert_eq!(body["error"], "unauthorized");
    }
    // Anonymous reads are not a user's: no user limit on them.
    for _ in 0..5 {
        let read = app
            .client
            .get(app.url(&format!("/vouchers/{voucher}")))
            .send()
            .await;
        assert_eq!(read.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(app.check_invariants(voucher).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_in_flight_is_refused_at_once_and_another_voucher_is_not() {
    let app = spawn_app_with(|s| s).await;
    let held = app.open_voucher(5).await;
    let other = app.open_voucher(5).await;
    let token = app.token(7).await;
    // The first purchase waits in its batch: the voucher's row is locked.
    let blocker = app.lock_voucher_row(held).await;
    let first = {
        let (client, base, token) = (app.client.clone(), app.base.clone(), token.clone());
        tokio::spawn(async move { buy(&client, &base, &token, held).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!first.is_finished(), "the first purchase waits for the row");

    // Its duplicates are refused without waiting for it.
    for _ in 0..5 {
        let started = Instant::now();
        let (status, code) = buy(&app.client, &app.base, &token, held).await;
        assert_eq!(
            (status, code.as_str()),
            (StatusCode::TOO_MANY_REQUESTS, "purchase_in_progress")
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "refused at once"
        );
    }
    // A 429 says when to ask again, as every 429 does.
    let duplicate = app
        .client
        .post(app.url(&format!("/seckill/{held}")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(duplicate.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        duplicate.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    // The same user buys another voucher meanwhile: the lock is per voucher.
    let (status, code) = buy(&app.client, &app.base, &token, other).await;
    assert_eq!(status, StatusCode::OK, "{code}");

    blocker.rollback().await.unwrap();
    let (status, code) = first.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{code}");
    assert_eq!(app.check_invariants(held).await, 1);
    assert_eq!(app.check_invariants(other).await, 1);
}

#[tokio::test]
async fn a_user_holds_at_most_max_orders_per_user_of_a_voucher() {
    let app = spawn_app_with(|s| s).await;
    let voucher = app
        .open_voucher_with(10, json!({ "max_orders_per_user": 2 }))
        .await;
    let token = app.token(3).await;
    let cancel = |order_id: String| {
        let (client, url, token) = (
            app.client.clone(),
            app.url(&format!("/orders/{order_id}/cancel")),
            token.clone(),
        );
        async move { answer(client.post(url).bearer_auth(token)).await }
    };
    for _ in 0..2 {
        let (status, answer) = buy(&app.client, &app.base, &token, voucher).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        let order_id = answer.trim_start_matches("ok:").to_owned();
        assert_eq!(cancel(order_id).await.0, StatusCode::OK);
    }
    // Two cancelled orders: the third purchase is refused, and the unit
    // stays on sale.
    let (status, code) = buy(&app.client, &app.base, &token, voucher).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::CONFLICT, "too_many_orders")
    );
    let stats = app.stats(voucher).await;
    assert_eq!(stats["stock"], 10, "{stats}");
    assert_eq!(stats["cancelled"], 2, "{stats}");
    assert_eq!(stats["max_orders_per_user"], 2, "{stats}");
    let (status, shown) = answer(app.client.get(app.url(&format!("/vouchers/{voucher}")))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(shown["max_orders_per_user"], 2, "{shown}");
    assert_eq!(shown["waiting_room"], Value::Null, "{shown}");
    // Another user still buys.
    let other = app.token(4).await;
    assert_eq!(
        buy(&app.client, &app.base, &other, voucher).await.0,
        StatusCode::OK
    );
    // The bound is checked when the voucher is made.
    let now = chrono::Utc::now();
    for bad in [0, 1001, -1] {
        let response = app
            .client
            .post(app.url("/admin/vouchers"))
            .bearer_auth(crate::helpers::ADMIN_TOKEN)
            .json(&json!({
                "title": "t", "stock": 1, "max_orders_per_user": bad,
                "begin_time": now, "end_time": now + chrono::Duration::hours(1),
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "max {bad}");
    }
    app.check_invariants(voucher).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_sale_bounds_a_users_orders_as_a_sync_one_does() {
    let app = spawn_app_with(|s| s).await;
    let voucher = app
        .open_voucher_with(
            10,
            json!({ "sale_mode": "async", "max_orders_per_user": 2 }),
        )
        .await;
    let token = app.token(3).await;
    let url = app.url(&format!("/seckill/{voucher}"));
    // A cancelled unit and its buyer go back to Redis by the relay, within
    // a second: until then the next purchase names the cancelled order.
    let buy_again = || async {
        let started = Instant::now();
        loop {
            let answer = send_purchase(&app.client, &url, &token).await;
            if answer.body["error"] != "already_purchased" {
                return answer;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{}",
                answer.body
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    for _ in 0..2 {
        let accepted = buy_again().await;
        assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.body);
        let order_id = accepted.body["order_id"].as_str().unwrap().to_owned();
        // Cancelled once stored: a pending order answers order_pending, and
        // a cancel that meets the writer's batch on the order's row may be
        // rolled back as a conflict (503, to retry).
        let url = app.url(&format!("/orders/{order_id}/cancel"));
        let started = Instant::now();
        loop {
            let (status, body) = answer(app.client.post(&url).bearer_auth(&token)).await;
            if status == StatusCode::OK {
                break;
            }
            assert!(
                ["order_pending", "unavailable"].contains(&body["error"].as_str().unwrap_or("")),
                "{body}"
            );
            assert!(started.elapsed() < Duration::from_secs(20), "never stored");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let refused = buy_again().await;
    assert_eq!(
        (refused.status, refused.body["error"].as_str()),
        (StatusCode::CONFLICT, Some("too_many_orders"))
    );
    let other = app.token(4).await;
    assert_eq!(
        buy(&app.client, &app.base, &other, voucher).await.0,
        StatusCode::ACCEPTED
    );
}

fn signed(body: &str) -> String {
    seckill::http::signature_header(PAYMENT_SECRET.as_bytes(), body.as_bytes())
}

async fn notify(app: &TestApp, payment_id: &str, order_id: &str) -> (StatusCode, Value) {
    let body =
        json!({ "payment_id": payment_id, "order_id": order_id, "amount_cents": 0 }).to_string();
    let request = app
        .client
        .post(app.url("/payments/notify"))
        .header("content-type", "application/json")
        .header("x-signature", signed(&body))
        .body(body);
    answer(request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_id_of_another_order_is_a_conflict_also_when_both_arrive_at_once() {
    let app = spawn_app_with(|s| s).await;
    let voucher = app.open_voucher(100).await;
    let tokens = app.tokens(1..=40).await;
    let mut orders = Vec::new();
    for user in 1..=40 {
        let (status, answer) = buy(&app.client, &app.base, &tokens[&user], voucher).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        orders.push(answer.trim_start_matches("ok:").to_owned());
    }
    // Sequentially: the second order's notification with the first's id.
    assert_eq!(notify(&app, "pay-a", &orders[0]).await.0, StatusCode::OK);
    let (status, body) = notify(&app, "pay-a", &orders[1]).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("payment_conflict"))
    );
    // At once: pairs of orders share a payment id.
    let mut pairs = Vec::new();
    for (i, pair) in orders[2..].chunks(2).enumerate() {
        let id = format!("pay-pair-{i}");
        for order in pair {
            let (app_client, url, id, order) = (
                app.client.clone(),
                app.url("/payments/notify"),
                id.clone(),
                order.clone(),
            );
            pairs.push(tokio::spawn(async move {
                let body =
                    json!({ "payment_id": id, "order_id": order, "amount_cents": 0 }).to_string();
                let request = app_client
                    .post(url)
                    .header("content-type", "application/json")
                    .header("x-signature", signed(&body))
                    .body(body);
                answer(request).await
            }));
        }
    }
    let mut answers = Vec::new();
    for pair in pairs {
        answers.push(pair.await.unwrap());
    }
    for pair in answers.chunks(2) {
        let mut statuses: Vec<u16> = pair.iter().map(|(s, _)| s.as_u16()).collect();
        statuses.sort_unstable();
        assert_eq!(statuses, [200, 409], "{pair:?}");
        let conflict = pair
            .iter()
            .find(|(s, _)| *s == StatusCode::CONFLICT)
            .unwrap();
        assert_eq!(conflict.1["error"], "payment_conflict");
    }
    // One order of each pair paid, the other untouched.
    let paid: i64 = sqlx::query_scalar("SELECT count(*) FROM voucher_orders WHERE status = 'paid'")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(paid, 1 + 19);
    app.check_invariants(voucher).await;
}

/// Sends a request head (ending in the blank line) on a new connection and
/// returns the connection.
async fn send_head(app: &TestApp, head: &str) -> TcpStream {
    let mut stream = TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// Reads what the server sends until it closes the connection (or `limit`
/// passes): the text, and whether it closed.
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut got = Vec::new();
    let mut buffer = [0u8; 4096];
    let closed = tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

#[tokio::test]
async fn payment_notifications_are_judged_by_their_head_before_the_body() {
    let app = spawn_app_with(|s| s).await;
    // A body declared and never sent: the answer comes all the same.
    let unsigned = "";
    let malformed = "X-Signature: sha256=zz\r\n";
    for signature in [unsigned, malformed] {
        answers_head_with(&app, signature, "HTTP/1.1 401").await;
    }

    let no_secret = spawn_app_with(|mut s| {
        s.payment_secret = None;
        s
    })
    .await;
    let tag = "a".repeat(64);
    let signed = format!("X-Signature: sha256={tag}\r\n");
    answers_head_with(&no_secret, &signed, "HTTP/1.1 403").await;
}

/// Sends the head of a payment notification with these `signature` lines
/// and a body declared and never sent: the answer (within 3 s) starts with
/// `status_line` all the same.
async fn answers_head_with(app: &TestApp, signature: &str, status_line: &str) {
    let declared = "Content-Type: application/json\r\nContent-Length: 2000000\r\n";
    let head = format!("POST /payments/notify HTTP/1.1\r\nHost: x\r\n{signature}{declared}\r\n");
    let mut stream = send_head(app, &head).await;
    let (text, _) = read_until_closed(&mut stream, Duration::from_secs(3)).await;
    assert!(text.starts_with(status_line), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_a_byte_at_a_time_is_cut_off_at_its_deadline() {
    let app = spawn_app_with(|mut s| {
        s.body_timeout = Duration::from_millis(1_000);
        s
    })
    .await;
    let tag = "b".repeat(64);
    let routes = [
        format!("POST /payments/notify HTTP/1.1\r\nHost: x\r\nX-Signature: sha256={tag}\r\n"),
        format!(
            "POST /admin/vouchers HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n",
            crate::helpers::ADMIN_TOKEN
        ),
    ];
    for head in routes {
        let started = Instant::now();
        let mut stream = send_head(
            &app,
            &format!("{head}Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"),
        )
        .await;
        // One byte every 200 ms: each well inside any per-read pause, and
        // the whole body would take 200 s.
        let mut trickle = Vec::new();
        let closed = loop {
            let (text, closed) = read_until_closed(&mut stream, Duration::from_millis(200)).await;
            trickle.push(text);
            if closed || started.elapsed() > Duration::from_secs(20) {
                break closed;
            }
            let _ = stream.write_all(b" ").await;
        };
        assert!(closed, "{head}: still open after {:?}", started.elapsed());
        // Closed at the deadline, give or take the machine's load (a bound
        // far from the 200 s the body would take, not a timing goal).
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        let text = trickle.concat();
        assert!(text.starts_with("HTTP/1.1 400"), "{head}: {text}");
        assert!(
            text.to_ascii_lowercase().contains("connection: close"),
            "{text}"
        );
    }
    // A route that reads no body answers at once, and the connection the
    // unread body would hold is closed rather than kept for it.
    let started = Instant::now();
    let mut stream = send_head(
        &app,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n",
    )
    .await;
    let (text, closed) = read_until_closed(&mut stream, Duration::from_secs(20)).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(closed, "still open after {:?}", started.elapsed());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // A client that sends its body whole is served as before.
    let voucher = app.open_voucher(1).await;
    assert!(voucher > 0);
}

/// Settings whose Postgres and Redis nothing answers: for what is refused
/// before either is asked.
fn unreachable_settings() -> seckill::config::Settings {
    settings(
        "postgres://unused@127.0.0.1:1/none",
        "redis://127.0.0.1:1",
        "x:",
    )
}

#[tokio::test]
async fn weak_secrets_stop_the_service_naming_their_variable() {
    let base = unreachable_settings();
    let long = "q8Zr4kWm2Tn6Yv1Xc5Bd9Hf3Lj7Pa0Se".to_owned();
    type Set = fn(&mut seckill::config::Settings, String);
    let cases: [(&str, Set); 3] = [
        ("SECKILL_ADMIN_TOKEN", |s, v| s.admin_token = Some(v.into())),
        ("SECKILL_TOKEN_SECRET", |s, v| {
            s.token_secret = Some(v.into())
        }),
        ("SECKILL_PAYMENT_SECRET", |s, v| {
            s.payment_secret = Some(v.into())
        }),
    ];
    for (variable, set) in cases {
        for weak in [
            "change-me",
            "secret",
            "change-me-too-change-me-too-change-me",
            &"a".repeat(40),
        ] {
            let mut settings = base.clone();
            set(&mut settings, weak.to_owned());
            let error = match Application::build(settings).await {
                Ok(_) => panic!("{variable}={weak:?} was taken"),
                Err(error) => error.to_string(),
            };
            assert!(error.contains(variable), "{variable}={weak:?}: {error}");
        }
        // A strong one passes the check (and the build goes on to fail on
        // the unreachable Postgres, not on the secret).
        let mut settings = base.clone();
        settings.startup_wait = Duration::ZERO;
        set(&mut settings, long.clone());
        let error = match Application::build(settings).await {
            Ok(_) => panic!("built without a Postgres"),
            Err(error) => error.to_string(),
        };
        assert!(!error.contains(variable), "{variable}: {error}");
    }
}

#[tokio::test]
async fn metrics_on_their_own_address_leave_the_public_one() {
    let db_app = spawn_app_with(|s| s).await;
    let mut settings = db_app.settings();
    settings.metrics_addr = Some("127.0.0.1:0".into());
    let app = Application::build(settings).await.expect("the app builds");
    let public = format!("http://{}", app.local_addr());
    let metrics = format!(
        "http://{}/metrics",
        app.metrics_addr().expect("a metrics address")
    );
    tokio::spawn(app.run_until(std::future::pending()));
    let page = db_app.client.get(&metrics).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let text = page.text().await.unwrap();
    assert!(text.contains("seckill_rate_limited_total"), "{text}");
    // Its errors are the API's JSON too.
    let (status, body) = answer(db_app.client.post(&metrics)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, Some("method_not_allowed"))
    );
    for (path, status) in [
        ("/metrics", StatusCode::NOT_FOUND),
        ("/healthz", StatusCode::OK),
    ] {
        let (got, _) = answer(db_app.client.get(format!("{public}{path}"))).await;
        assert_eq!(got, status, "{path}");
    }
    // The public address still describes /metrics, its 404 included.
    let (_, doc) = answer(db_app.client.get(format!("{public}/openapi.json"))).await;
    let described = &doc["paths"]["/metrics"]["get"]["responses"];
    assert!(described.get("404").is_some(), "{described}");
}

#[test]
fn a_setting_the_service_cannot_take_stops_it_naming_the_variable() {
    // A value of the wrong kind, a zero where none can work, a duration
    // past a day: refused before anything starts, the variable named (clap
    // named only the flag; a pool of 0 panicked after the migrations).
    for (variable, value) in [
        ("SECKILL_LIMIT_PER_ADDRESS", "abc"),
        ("SECKILL_PG_POOL", "0"),
        ("SECKILL_PG_POOL_OTHER", "0"),
        ("SECKILL_MAX_CONNECTIONS", "0"),
        ("SECKILL_LOCK_LEASE_MS", "0"),
        ("SECKILL_DEPENDENCY_TIMEOUT_MS", "2000000000"),
        ("SECKILL_USER_LOCKS", "maybe"),
        ("SECKILL_TRUSTED_PROXIES", "not-an-address"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"))
            .arg("serve")
            .env(variable, value)
            .env("DATABASE_URL", "postgres://unused@127.0.0.1:1/none")
            .output()
            .expect("the binary runs");
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{variable}={value}: {said}");
        assert!(said.contains(variable), "{variable}={value}: {said}");
    }
}

#[tokio::test]
async fn an_address_the_service_cannot_listen_on_stops_it_naming_its_variable() {
    // Postgres is not reachable here: the addresses are judged before it
    // is waited for.
    let base = unreachable_settings();
    let mut public = base.clone();
    public.addr = "not-an-address".into();
    let mut metrics = base;
    metrics.metrics_addr = Some("not-an-address".into());
    for (settings, variable) in [(public, "SECKILL_ADDR"), (metrics, "SECKILL_METRICS_ADDR")] {
        let started = Instant::now();
        assert_refused_to_start(settings, variable).await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{variable}: refused after {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn a_postgres_url_that_is_not_one_stops_the_service_naming_its_variable() {
    let base = unreachable_settings();
    let mut main = base.clone();
    main.database_url = "postgres://user@host:notaport/db".into();
    let mut direct = base;
    direct.database_direct_url = Some("mysql://somewhere/else".into());
    for (settings, variable) in [
        (main, "DATABASE_URL"),
        (direct, "SECKILL_DATABASE_DIRECT_URL"),
    ] {
        assert_refused_to_start(settings, variable).await;
    }
}

#[tokio::test]
async fn a_lock_node_that_is_no_redis_url_stops_the_service_naming_its_variable() {
    let db_app = spawn_app_with(|s| s).await;
    let mut settings = db_app.settings();
    settings.lock_redis_urls = vec![
        crate::helpers::redis_url(),
        "not-a-redis-url".into(),
        crate::helpers::redis_url(),
    ];
    let error = match Application::build(settings).await {
        Ok(_) => panic!("the lock nodes were taken"),
        Err(error) => seckill::telemetry::Chain(&error).to_string(),
    };
    assert!(
        error.contains("SECKILL_LOCK_REDIS_URLS") && !error.contains("REDIS_URL cannot"),
        "{error}"
    );
}
