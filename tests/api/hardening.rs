//! What black-box testing found, one test per defect: Redis state that
//! outlives its database, a lost id counter, frozen dependencies, slow
//! clients and shutdown, unbounded metrics labels, skewed clocks, and the
//! answer a retry gets after a lost one.

use std::time::{Duration, Instant};

use chrono::Utc;
use reqwest::StatusCode;
use seckill::domain::OrderId;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{
    buy, client, redis_conn, send_purchase, spawn_app, spawn_app_on_own_redis, spawn_app_on_redis,
    spawn_app_with, start_stoppable, Answer, OwnRedis, TestApp, ADMIN_TOKEN,
};
use crate::proxy::spawn_app_behind_pg_proxy_timing_out;

/// Sends a purchase and returns the status, the headers' `Retry-After`,
/// the body and how long the answer took.
async fn purchase(
    app: &TestApp,
    token: &str,
    voucher: i64,
) -> (StatusCode, Option<String>, Value, Duration) {
    let url = app.url(&format!("/seckill/{voucher}"));
    let Answer {
        status,
        retry_after,
        body,
        took,
    } = send_purchase(&app.client, &url, token).await;
    (status, retry_after, body, took)
}

async fn restock(app: &TestApp, voucher: i64, add: i64) -> StatusCode {
    app.client
        .post(app.url(&format!("/admin/vouchers/{voucher}/stock")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&serde_json::json!({ "add": add }))
        .send()
        .await
        .unwrap()
        .status()
}

// 1. Redis state that outlives its database.

#[tokio::test]
async fn a_sold_out_flag_of_another_database_never_refuses_this_ones_stock() {
    // The first database sells its voucher 1 out: its flag is in Redis.
    let first = spawn_app().await;
    let sold = first.open_voucher(1).await;
    let tokens = first.tokens([1, 2]).await;
    assert_eq!(
        buy(&first.client, &first.base, &tokens[&1], sold).await.0,
        StatusCode::OK
    );
    assert_eq!(
        buy(&first.client, &first.base, &tokens[&2], sold).await,
        (StatusCode::CONFLICT, "sold_out".into())
    );

    // A second database on the same Redis and prefix (a reset Postgres, or
    // another deployment): its own voucher 1 sells.
    let prefix = first.prefix.clone();
    let second = spawn_app_with(|mut s| {
        s.redis_prefix = prefix;
        s
    })
    .await;
    let fresh = second.open_voucher(2).await;
    assert_eq!(
        fresh, sold,
        "both databases number their first voucher alike"
    );
    let tokens = second.tokens([1, 2, 3]).await;
    second.assert_bought(&tokens[&1], fresh).await;
    second.assert_bought(&tokens[&2], fresh).await;
    assert_eq!(
        buy(&second.client, &second.base, &tokens[&3], fresh).await,
        (StatusCode::CONFLICT, "sold_out".into())
    );
    // A restock to an initial stock below the other database's flags
    // reopens the sale too.
    assert_eq!(restock(&second, fresh, 1).await, StatusCode::OK);
    second.assert_bought(&tokens[&3], fresh).await;
    second.check_invariants(fresh).await;
    first.check_invariants(sold).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restock_reopens_the_sale_even_while_redis_cannot_hear_of_it() {
    let redis = OwnRedis::start();
    let url = redis.url();
    let app = spawn_app_with(|mut s| {
        s.redis_url = url;
        s.dependency_timeout = Duration::from_millis(500);
        s.voucher_cache_ttl = Duration::from_millis(100);
        s
    })
    .await;
    let (voucher, tokens) = app.warm_sale(1, 2).await;
    assert_eq!(
        buy(&app.client, &app.base, &tokens[&2], voucher).await,
        (StatusCode::CONFLICT, "sold_out".into())
    );

    // Redis is stuck while the admin restocks: the restock needs no word
    // with it, and the flag it keeps is of the voucher's older epoch.
    redis.freeze();
    let answered = tokio::time::timeout(Duration::from_secs(10), restock(&app, voucher, 1)).await;
    redis.thaw();
    assert_eq!(answered.expect("the restock answers"), StatusCode::OK);
    app.wait_ready().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        buy(&app.client, &app.base, &tokens[&2], voucher)
            .await
            .1
            .starts_with("ok:"),
        "the restocked unit sells"
    );
    assert_eq!(app.check_invariants(voucher).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_restock_while_redis_is_stuck_is_answered_once_and_its_units_sell_when_it_answers()
{
    // An async sale sells from Redis's stock: a restock rebuilds it. With
    // Redis stuck, the rebuild cannot run; the restock is committed all the
    // same, so it answers 200 (an error would be retried by the admin, and
    // add the units twice), and the sale catches up once Redis answers.
    let redis = OwnRedis::start();
    let url = redis.url();
    let app = spawn_app_with(|mut s| {
        s.redis_url = url;
        s.dependency_timeout = Duration::from_millis(500);
        s
    })
    .await;
    let voucher = app.open_async_voucher(1).await;
    let tokens = app.tokens(1..=2).await;
    let (status, _, first, _) = purchase(&app, &tokens[&1], voucher).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    let (status, _, body, _) = purchase(&app, &tokens[&2], voucher).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("sold_out"))
    );

    redis.freeze();
    let answered = tokio::time::timeout(Duration::from_secs(10), restock(&app, voucher, 1)).await;
    redis.thaw();
    assert_eq!(answered.expect("the restock answers"), StatusCode::OK);
    let (_, stats) = app
        .admin_get(&format!("/admin/vouchers/{voucher}/stats"))
        .await;
    assert_eq!(stats["initial_stock"], 2, "{stats}");

    // Once Redis answers, the supervisors rebuild the sale from Postgres:
    // the restocked unit sells, to the second buyer.
    let deadline = Instant::now() + Duration::from_secs(20);
    let order = loop {
        let (status, _, body, _) = purchase(&app, &tokens[&2], voucher).await;
        match status {
            StatusCode::ACCEPTED => break body,
            StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE => {
                assert!(
                    Instant::now() < deadline,
                    "the restocked unit never sold: {status} {body}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("{other}: {body}"),
        }
    };
    let orders: Vec<String> = [first, order]
        .iter()
        .map(|o| o["order_id"].as_str().unwrap().to_owned())
        .collect();
    app.wait_confirmed(&orders).await;
    assert_eq!(app.check_invariants(voucher).await, 2);
}

// 2. A lost order-id counter.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_lost_within_the_second_is_raised_past_the_ids_taken() {
    let (mut redis, app) = spawn_app_on_own_redis(None).await;
    let voucher = app.open_voucher(1_000).await;
    let tokens = app.tokens(1..=200).await;
    let mut next_user = 1;
    // Eight purchases, Redis restarted without persistence, and one more,
    // all within one second; tried again if a second boundary fell in
    // between (then the counter's loss collides with nothing).
    for attempt in 0..8 {
        if attempt > 0 {
            // The last attempt's purchase after the restart took the
            // counter's first ids: lose it again, so that this attempt's
            // eight are the first of the counter too.
            redis.stop();
            redis.restart();
            app.wait_ready().await;
        }
        // Start just after a second begins.
        let into_second = Utc::now().timestamp_subsec_millis();
        tokio::time::sleep(Duration::from_millis(u64::from(1_000 - into_second) + 5)).await;
        let mut first_ids = Vec::new();
        for _ in 0..8 {
            let (status, code) = buy(&app.client, &app.base, &tokens[&next_user], voucher).await;
            next_user += 1;
            assert_eq!(status, StatusCode::OK, "{code}");
            first_ids.push(code.trim_start_matches("ok:").parse::<OrderId>().unwrap());
        }
        redis.stop();
        redis.restart();
        app.wait_ready().await;
        let user = next_user;
        next_user += 1;
        let answer = buy(&app.client, &app.base, &tokens[&user], voucher).await;
        assert_eq!(answer.0, StatusCode::OK, "{answer:?}");
        let id: OrderId = answer.1.trim_start_matches("ok:").parse().unwrap();
        let second = id.seconds_since_epoch();
        if first_ids.iter().any(|f| f.seconds_since_epoch() != second) {
            continue;
        }
        assert!(
            id.sequence() > 8,
            "the counter counts on past the ids taken in that second"
        );
        assert_eq!(app.check_invariants(voucher).await, next_user - 1);
        return;
    }
    panic!("never managed eight purchases, a Redis restart and a purchase within one second");
}

// 3. Frozen dependencies.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_postgres_is_a_prompt_503_and_sales_resume_when_it_thaws() {
    let (app, proxy) = spawn_app_behind_pg_proxy_timing_out(500).await;
    let (voucher, tokens) = app.warm_sale(10, 3).await;

    proxy.freeze();
    let frozen = tokio::time::timeout(
        Duration::from_secs(15),
        purchase(&app, &tokens[&2], voucher),
    )
    .await;
    let ready = app
        .client
        .get(app.url("/readyz"))
        .send()
        .await
        .unwrap()
        .status();
    proxy.thaw();
    let (status, retry_after, body, took) = frozen.expect("answered while Postgres is frozen");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "unavailable");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(
        took < Duration::from_secs(5),
        "held {took:?} by a frozen Postgres"
    );
    assert_eq!(ready, StatusCode::SERVICE_UNAVAILABLE);

    app.wait_ready().await;
    let (status, _, body, _) = purchase(&app, &tokens[&3], voucher).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // User 2's purchase may have committed after its 503: either way one
    // order at most, and the books balance.
    let orders = app.check_invariants(voucher).await;
    assert!((2..=3).contains(&orders), "{orders} orders");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_is_a_prompt_503_and_sales_resume_when_it_thaws() {
    let redis = OwnRedis::start();
    let url = redis.url();
    let app = spawn_app_on_redis(url, Some(500)).await;
    let (voucher, tokens) = app.warm_sale(10, 4).await;

    redis.freeze();
    let answers = tokio::time::timeout(
        Duration::from_secs(15),
        futures::future::join(
            purchase(&app, &tokens[&2], voucher),
            purchase(&app, &tokens[&3], voucher),
        ),
    )
    .await;
    redis.thaw();
    let (a, b) = answers.expect("answered while Redis is frozen");
    for (status, retry_after, body, took) in [a, b] {
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(retry_after.as_deref(), Some("1"));
        assert!(
            took < Duration::from_secs(5),
            "held {took:?} by a frozen Redis"
        );
    }

    app.wait_ready().await;
    let mut last = None;
    for _ in 0..20 {
        let answer = purchase(&app, &tokens[&4], voucher).await;
        if answer.0 == StatusCode::OK {
            last = Some(answer);
            break;
        }
        assert_eq!(answer.0, StatusCode::SERVICE_UNAVAILABLE, "{}", answer.2);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(last.is_some(), "sales did not resume after Redis thawed");
    app.check_invariants(voucher).await;
}

// 4. Shutdown and slow clients.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_within_its_timeout_whatever_half_sent_requests_do() {
    let app = spawn_app().await;
    let mut settings = app.settings();
    settings.shutdown_timeout = Duration::from_millis(1_000);
    settings.header_timeout = Duration::from_millis(60_000);
    let running = start_stoppable(settings).await;
    let addr = running.base.trim_start_matches("http://").to_owned();

    // Headers never finished, and a body cut short.
    let mut headers_only = TcpStream::connect(&addr).await.unwrap();
    headers_only
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut short_body = TcpStream::connect(&addr).await.unwrap();
    short_body
        .write_all(
            format!(
                "POST /admin/vouchers HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\
                 Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"title\""
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let asked = Instant::now();
    running.stop.send(()).unwrap();
    let stopped = tokio::time::timeout(Duration::from_secs(10), running.stopped).await;
    assert!(stopped.is_ok(), "still running 10 s after shutdown began");
    // The timeout, and half a second for a busy machine's scheduling.
    assert!(
        asked.elapsed() < Duration::from_millis(1_500),
        "shutdown took {:?} with a 1 s timeout",
        asked.elapsed()
    );
    drop((headers_only, short_body));
}

/// `/healthz` answers 200 within 10 s (a bound far from any timing goal):
/// the door is not held.
async fn assert_healthy_within_10_s(app: &TestApp) {
    let started = Instant::now();
    let health = tokio::time::timeout(
        Duration::from_secs(10),
        client().get(app.url("/healthz")).send(),
    )
    .await;
    assert_eq!(
        health.expect("/healthz answered").unwrap().status(),
        StatusCode::OK,
        "after {:?}",
        started.elapsed()
    );
}

/// An app with a door a stalled client could hold: at most `connections`
/// client connections, and a header deadline of 500 ms that cuts a stalled
/// one off.
async fn app_with_a_door(connections: usize) -> TestApp {
    spawn_app_with(|mut s| {
        s.header_timeout = Duration::from_millis(500);
        s.max_connections = Some(connections);
        s
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_and_cannot_hold_the_door() {
    let app = app_with_a_door(20).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    // Sixty connections that start a request and never finish its headers.
    let mut slow = Vec::new();
    for _ in 0..60 {
        let mut stream = TcpStream::connect(&addr).await.unwrap();
        let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nX-Slow: ").await;
        slow.push(stream);
    }
    // Each is closed by the server once the header deadline passes.
    let first = &mut slow[0];
    let mut byte = [0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match first.read(&mut byte).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "a connection stuck in its headers stayed open"
    );
    // And a client that buys gets through in spite of the other slow ones.
    assert_healthy_within_10_s(&app).await;
}

#[tokio::test]
async fn headers_past_128_kib_are_refused_at_once_not_buffered() {
    // 160 KiB of one header, its end not sent: refused as soon as the bound
    // is passed (hyper buffered up to about 400 KiB of an unfinished header
    // per connection, for the whole header deadline, before).
    let app = spawn_app().await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut stream = TcpStream::connect(&addr).await.unwrap();
    let mut request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Filler: ".to_vec();
    request.extend(std::iter::repeat_n(b'a', 160 * 1024));
    stream.write_all(&request).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    assert!(
        read.is_ok(),
        "the connection was held with its header unfinished"
    );
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    // A request with headers of a usual size is served.
    assert_healthy_within_10_s(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_answer_is_cut_off_and_cannot_hold_the_door() {
    // One connection at a time: a client that holds it holds the door.
    let app = app_with_a_door(1).await;
    // It asks for more than the socket buffers hold (a 1.4 MB file, eight
    // times over, pipelined), with a small window of its own, and reads
    // none of it.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(2048).unwrap();
    let addr = app.base.trim_start_matches("http://").parse().unwrap();
    let mut reader = socket.connect(addr).await.unwrap();
    reader
        .write_all(&b"GET /docs/swagger-ui-bundle.js HTTP/1.1\r\nHost: x\r\n\r\n".repeat(8))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The server gives up on it once it has taken nothing for the header
    // deadline, and the next client gets the connection.
    assert_healthy_within_10_s(&app).await;
    // What the reader gets when it reads at last is a part of the file,
    // then the end of the connection.
    let mut taken = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), reader.read_to_end(&mut taken)).await;
    assert!(ended.is_ok(), "the stalled connection is still open");
    assert!(String::from_utf8_lossy(&taken).starts_with("HTTP/1.1 200"));
    drop(reader);
}

// 5. Metrics labels come from bounded sets.

#[tokio::test]
async fn strange_methods_add_no_metric_series() {
    let app = spawn_app().await;
    app.metrics().await;
    let before = app.metrics().await.len();
    for i in 0..50 {
        let method = format!("M{i}{}", "X".repeat(2_000));
        let response = app
            .client
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                app.url("/healthz"),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    }
    let after = app.metrics().await;
    assert!(!after.contains("XXXXXXXX"), "a method became a label");
    assert!(after.contains(r#"method="other""#));
    assert!(
        after.len() < before + 4_000,
        "/metrics grew from {before} to {} bytes",
        after.len()
    );
}

// 7. One clock for the sale window.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_clock_runs_fast_does_not_open_the_sale_early() {
    let app = spawn_app().await;
    let mut fast = app.settings();
    fast.fault_clock_skew_ms = 30_000;
    let fast_base = app.spawn_instance_with(fast).await;
    let now = Utc::now();
    let voucher = app
        .create_voucher(
            5,
            now + chrono::Duration::seconds(15),
            now + chrono::Duration::hours(1),
        )
        .await;
    let token = app.token(1).await;
    for base in [&app.base, &fast_base] {
        assert_eq!(
            buy(&app.client, base, &token, voucher).await,
            (StatusCode::CONFLICT, "not_started".into()),
            "{base}"
        );
    }
    assert_eq!(app.check_invariants(voucher).await, 0);
}

// 8. A retry after a lost answer learns its order.

#[tokio::test]
async fn already_purchased_names_the_order_the_user_holds() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(5).await;
    let token = app.token(7).await;
    let (status, _, first, _) = purchase(&app, &token, voucher).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, again, _) = purchase(&app, &token, voucher).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(again["error"], "already_purchased");
    assert_eq!(again["order_id"], first["order_id"], "{again}");
    assert!(again["order_id"].is_string());
}

// Redis keys: all under the database's namespace.

#[tokio::test]
async fn every_key_the_service_writes_is_under_its_databases_namespace() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(1).await;
    let tokens = app.tokens([1, 2]).await;
    buy(&app.client, &app.base, &tokens[&1], voucher).await;
    buy(&app.client, &app.base, &tokens[&2], voucher).await;
    let mut conn = redis_conn(&crate::helpers::redis_url()).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", app.prefix))
        .query_async(&mut conn)
        .await
        .unwrap();
    let keyspace = app.keyspace().await;
    assert!(!keys.is_empty());
    for key in keys {
        assert!(key.starts_with(&keyspace), "{key} is outside {keyspace}");
    }
}
