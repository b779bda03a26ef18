//! A dependency that goes away mid-run: answers become 503 with
//! Retry-After, nothing else breaks, and the service recovers by itself.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::StatusCode;

use crate::helpers::{
    buy, crowd, poll_until, send_purchase, spawn_app, spawn_app_on_own_redis, spawn_app_on_redis,
    spawn_app_with, OwnRedis, TestApp,
};
use crate::proxy::{pg_proxy, spawn_app_behind_pg_proxy};

const DURING_OUTAGE: [&str; 5] = [
    "ok",
    "sold_out",
    "already_purchased",
    "purchase_in_progress",
    "unavailable",
];

fn code(answer: &(i64, StatusCode, String)) -> &str {
    if answer.2.starts_with("ok:") {
        "ok"
    } else {
        &answer.2
    }
}

async fn expect_unavailable(app: &TestApp, token: &str, voucher: i64) {
    let url = app.url(&format!("/seckill/{voucher}"));
    let answer = send_purchase(&app.client, &url, token).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.retry_after.as_deref(), Some("1"));
    assert_eq!(answer.body["error"], "unavailable");
    let ready = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
}

/// Runs the outage scenario: a crowd before, during and after the
/// dependency is away, then the invariants.
async fn outage(app: TestApp, take_away: impl FnOnce(), bring_back: impl FnOnce()) {
    let voucher = app.open_voucher(150).await;
    let tokens = app.tokens(1..=300).await;
    let early: HashMap<i64, String> = tokens
        .iter()
        .filter(|(u, _)| **u <= 50)
        .map(|(u, t)| (*u, t.clone()))
        .collect();

    let before = crowd(&[&app.base], &early, voucher, 1).await;
    assert!(before.iter().all(|a| code(a) == "ok"), "{before:?}");

    // The crowd is still arriving when the dependency goes away.
    let during = {
        let base = [app.base.as_str()];
        let running = crowd(&base, &tokens, voucher, 2);
        let cut = async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            take_away();
        };
        let (answers, ()) = tokio::join!(running, cut);
        answers
    };
    for answer in &during {
        assert!(
            DURING_OUTAGE.contains(&code(answer)),
            "unexpected answer {answer:?}"
        );
    }
    expect_unavailable(&app, &tokens[&300], voucher).await;

    bring_back();
    app.wait_ready().await;
    let after = crowd(&[&app.base], &tokens, voucher, 1).await;
    for answer in &after {
        assert!(
            ["ok", "sold_out", "already_purchased"].contains(&code(answer)),
            "after recovery: {answer:?}"
        );
    }
    // 300 users wanted 150 units and each asked again after recovery:
    // everything sold, once per user.
    assert_eq!(app.check_invariants(voucher).await, 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_going_away_is_a_503_and_the_service_recovers() {
    let redis = std::sync::Mutex::new(OwnRedis::start());
    let url = redis.lock().unwrap().url();
    let app = spawn_app_on_redis(url, None).await;
    outage(
        app,
        || redis.lock().unwrap().stop(),
        || redis.lock().unwrap().restart(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_going_away_is_a_503_and_the_service_recovers() {
    let (app, proxy) = spawn_app_behind_pg_proxy(|mut s| {
        // Windows served from memory would hide the outage from the
        // first requests; read them every time here.
        s.voucher_cache_ttl = Duration::from_millis(1);
        s
    })
    .await;
    outage(app, || proxy.cut(), || proxy.restore()).await;
}

/// How long a purchase took and how it was answered.
async fn timed_purchase(app: &TestApp, token: &str, voucher: i64) -> (Duration, StatusCode) {
    let url = app.url(&format!("/seckill/{voucher}"));
    let answer = send_purchase(&app.client, &url, token).await;
    (answer.took, answer.status)
}

/// One deadline at most, whatever hangs: the purchase's steps each have
/// the dependency deadline, and together they have it once (with a
/// quarter for scheduling on a busy machine).
fn assert_one_deadline(took: Duration, status: StatusCode, deadline: Duration) {
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        took <= deadline + deadline / 4,
        "a purchase took {took:?} with a deadline of {deadline:?}"
    );
}

/// A sale with one order bought; then, with the dependency frozen by
/// `freeze` (and `settle` waited), two more purchases meet one deadline
/// at most; once `thaw` let it run again, the service is ready and the
/// books balance.
async fn one_deadline_while_frozen(
    app: TestApp,
    freeze: impl FnOnce(),
    settle: Duration,
    thaw: impl FnOnce(),
) {
    let deadline = Duration::from_millis(1_000);
    let (voucher, tokens) = app.warm_sale(10, 3).await;
    freeze();
    if !settle.is_zero() {
        tokio::time::sleep(settle).await;
    }
    for user in [2, 3] {
        let (took, status) = timed_purchase(&app, &tokens[&user], voucher).await;
        assert_one_deadline(took, status, deadline);
    }
    thaw();
    app.wait_ready().await;
    app.check_invariants(voucher).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_meets_one_deadline_at_most_when_redis_hangs() {
    let redis = OwnRedis::start();
    let app = spawn_app_on_redis(redis.url(), Some(1_000)).await;
    // Frozen (SIGSTOP): every Redis step of the purchase would wait its
    // own deadline (the flag's read, the lock, the ids).
    let settle = Duration::from_millis(300);
    one_deadline_while_frozen(app, || redis.freeze(), settle, || redis.thaw()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_meets_one_deadline_at_most_when_postgres_hangs() {
    let (app, proxy) = crate::proxy::spawn_app_behind_pg_proxy_timing_out(1_000).await;
    // Whatever the frozen batches did is whole: a 503 was an unknown
    // outcome, never a lost or a doubled unit.
    one_deadline_while_frozen(app, || proxy.freeze(), Duration::ZERO, || proxy.thaw()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_committed_just_before_redis_hangs_is_answered_200_not_timed_out() {
    // The batch commits while Redis is frozen: the release of the buyer's
    // lock hangs. The buyer is answered once the release has had a moment,
    // not when the purchase's deadline runs out (a 503 for an order that
    // is committed).
    let redis = OwnRedis::start();
    let url = redis.url();
    let (app, proxy) = spawn_app_behind_pg_proxy(|mut s| {
        s.redis_url = url;
        s.dependency_timeout = Duration::from_millis(3_000);
        s
    })
    .await;
    let (voucher, tokens) = app.warm_sale(10, 2).await;
    // Postgres held: the purchase takes its lock and waits in its batch.
    proxy.freeze();
    let purchase = {
        let url = app.url(&format!("/seckill/{voucher}"));
        let (client, token) = (app.client.clone(), tokens[&2].clone());
        tokio::spawn(async move { send_purchase(&client, &url, &token).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.freeze();
    proxy.thaw();
    let answer = purchase.await.unwrap();
    redis.thaw();
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
    app.wait_ready().await;
    app.check_invariants(voucher).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_redis_hangs_is_answered_without_waiting_out_redis() {
    // The cancel is Postgres's to decide; telling the sale that the unit
    // came back (the sold-out flag's new epoch) is Redis's. With Redis
    // frozen, the buyer hears the committed cancel after a moment, not
    // after Redis's deadline (or two), and the flag is told later.
    let (redis, app) = spawn_app_on_own_redis(Some(5_000)).await;
    // One unit, bought: the voucher is sold out.
    let (voucher, tokens) = app.warm_sale(1, 2).await;
    let (status, body) = app
        .admin_get(&format!("/admin/vouchers/{voucher}/orders"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let order = body["orders"][0]["order_id"].as_str().unwrap().to_owned();
    redis.freeze();
    let started = std::time::Instant::now();
    let (status, body) = app
        .post_as(&format!("/orders/{order}/cancel"), &tokens[&1])
        .await;
    let took = started.elapsed();
    redis.thaw();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "cancelled", "{body}");
    assert!(
        took < Duration::from_millis(2_500),
        "answered after {took:?}"
    );
    // Once Redis answers, the flag every instance reads is open at the
    // return's epoch (1 unit + 1 returned), and the unit sells again.
    let flag = format!("{}seckill:soldout:{voucher}", app.keyspace().await);
    let conn = testkit::redis_conn(&redis.url()).await;
    let (epoch, sold_out) = poll_until(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "the sold-out flag opened at the new epoch",
        || {
            let (conn, flag) = (conn.clone(), flag.clone());
            async move {
                let mut conn = conn;
                redis::cmd("HMGET")
                    .arg(&flag)
                    .arg("epoch")
                    .arg("sold_out")
                    .query_async::<(Option<i64>, Option<u8>)>(&mut conn)
                    .await
                    .unwrap()
            }
        },
        |read| *read == (Some(2), Some(0)),
    )
    .await;
    assert_eq!((epoch, sold_out), (Some(2), Some(0)));
    app.wait_ready().await;
    app.assert_bought(&tokens[&2], voucher).await;
    app.check_invariants(voucher).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_voucher_ids_asked_at_once_while_postgres_hangs_share_one_deadline() {
    // Ids above the highest voucher ask Postgres for the highest id: with
    // Postgres frozen, the requests asking at once share one read and its
    // failure, instead of each waiting for the one before to time out (a
    // lock held across the read made eight requests take eight deadlines).
    let (app, proxy) = crate::proxy::spawn_app_behind_pg_proxy_timing_out(1_000).await;
    let known = app.open_voucher(1).await;
    proxy.freeze();
    let started = std::time::Instant::now();
    let asks = (1..=8).map(|n| {
        let url = app.url(&format!("/vouchers/{}", known + 1_000 * n));
        let client = app.client.clone();
        async move {
            let response = client.get(url).send().await.unwrap();
            (response.status(), started.elapsed())
        }
    });
    for (status, took) in futures_util::future::join_all(asks).await {
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(took < Duration::from_secs(4), "answered after {took:?}");
    }
    proxy.thaw();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_whose_statement_postgres_cancels_is_a_503_never_a_500() {
    // A long deadline: the answer must come from the cancel, not from it.
    let app = spawn_app_with(|mut s| {
        s.dependency_timeout = Duration::from_secs(20);
        s
    })
    .await;
    let voucher = app.open_voucher(5).await;
    let token = app.token(11).await;
    // The purchase's batch waits for the voucher's row, held here.
    let blocker = app.lock_voucher_row(voucher).await;
    let purchase = {
        let (client, base, token) = (app.client.clone(), app.base.clone(), token.clone());
        tokio::spawn(async move {
            send_purchase(&client, &format!("{base}/seckill/{voucher}"), &token).await
        })
    };
    // The backend waiting for that row lock, cancelled as an operator's
    // `pg_cancel_backend` (or a `statement_timeout`) would.
    let mut cancelled = false;
    for _ in 0..500 {
        cancelled = sqlx::query_scalar::<_, bool>(
            "SELECT coalesce(bool_or(pg_cancel_backend(pid)), false) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
             AND wait_event_type = 'Lock'",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        if cancelled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(cancelled, "no backend waited for the voucher's row");
    let answer = purchase.await.unwrap();
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.body
    );
    assert_eq!(answer.body["error"], "unavailable");
    assert!(answer.retry_after.is_some());
    blocker.rollback().await.unwrap();
    // Nothing was sold by the cancelled statement; the retry buys.
    let again = send_purchase(
        &app.client,
        &app.url(&format!("/seckill/{voucher}")),
        &token,
    )
    .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(app.check_invariants(voucher).await, 1);
}

#[tokio::test]
async fn a_transaction_left_open_by_a_frozen_instance_is_ended_by_postgres_and_sales_resume() {
    let deadline = Duration::from_millis(300);
    let app = spawn_app_with(|mut s| {
        s.dependency_timeout = deadline;
        s
    })
    .await;
    let voucher = app.open_voucher(5).await;
    // An instance's session inside a transaction that holds the voucher's
    // row, whose instance then stops (`SIGSTOP`, or a cut network): it
    // sends nothing more, neither the next statement nor the commit.
    let mut frozen = app.service_session().await;
    sqlx::query("BEGIN").execute(&mut frozen).await.unwrap();
    sqlx::query("SELECT 1 FROM seckill_vouchers WHERE voucher_id = $1 FOR UPDATE")
        .bind(voucher)
        .execute(&mut frozen)
        .await
        .unwrap();
    let held = std::time::Instant::now();
    // Meanwhile every purchase waits for the row, until its deadline.
    let (status, body) = buy(&app.client, &app.base, &app.token(1).await, voucher).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // Postgres ends that session by itself (twice the deadline, at least
    // a second), and the voucher sells again: before, never. (A purchase
    // answered 503 may commit once the row is free: its retry is then
    // told `already_purchased`.)
    let bound = seckill::store::server_bound(deadline);
    let token = app.token(2).await;
    loop {
        let (status, body) = buy(&app.client, &app.base, &token, voucher).await;
        if status == StatusCode::OK || body.contains("already_purchased") {
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(
            held.elapsed() < bound * 4,
            "still refused {:?} after the row was taken",
            held.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(held.elapsed() >= bound, "sold while the row was held");
    let gone = sqlx::query("SELECT 1").execute(&mut frozen).await;
    assert!(gone.is_err(), "the frozen session was not ended");
    assert!(app.check_invariants(voucher).await >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_that_accepts_and_stays_silent_at_start_up_is_waited_for() {
    // Connections are accepted and held without an answer for two seconds
    // (a server starting, or frozen): each attempt times out after 500 ms
    // and is made again within the start-up wait, not fatal at once.
    let (proxy, via_proxy) = pg_proxy().await;
    proxy.hold_new();
    let proxy = std::sync::Arc::new(proxy);
    let released = {
        let proxy = proxy.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            proxy.release();
        })
    };
    let app = spawn_app_with(|mut s| {
        let database = s.database_url.rsplit('/').next().unwrap().to_owned();
        s.database_url = format!("{via_proxy}/{database}");
        s.dependency_timeout = Duration::from_millis(500);
        s.startup_wait = Duration::from_secs(30);
        s
    })
    .await;
    released.await.unwrap();
    let voucher = app.open_voucher(1).await;
    app.assert_bought(&app.token(5).await, voucher).await;
}

#[tokio::test]
async fn a_starting_instance_answers_healthz_and_is_not_ready_while_it_waits_for_postgres() {
    // Postgres accepts and stays silent until the probes are done: the
    // instance has its address meanwhile, says it runs and is not ready,
    // and refuses every other request as unavailable, never a refused port.
    let (proxy, via_proxy) = pg_proxy().await;
    proxy.hold_new();
    let port = crate::helpers::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let starting = spawn_app_with(move |mut s| {
        let database = s.database_url.rsplit('/').next().unwrap().to_owned();
        s.database_url = format!("{via_proxy}/{database}");
        s.dependency_timeout = Duration::from_millis(500);
        s.startup_wait = Duration::from_secs(30);
        s.addr = format!("127.0.0.1:{port}");
        s
    });
    let client = crate::helpers::client();
    let probed = async {
        let healthz = crate::helpers::poll_until(
            Duration::from_secs(10),
            Duration::from_millis(50),
            "the starting instance's /healthz",
            || client.get(format!("{base}/healthz")).send(),
            |answer| answer.is_ok(),
        )
        .await;
        assert_eq!(healthz.unwrap().status(), StatusCode::OK);
        for (method, path) in [
            (reqwest::Method::GET, "/readyz"),
            (reqwest::Method::GET, "/vouchers"),
            (reqwest::Method::POST, "/seckill/1"),
        ] {
            let response = client
                .request(method, format!("{base}{path}"))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
            assert!(response.headers().contains_key("retry-after"), "{path}");
            let body: serde_json::Value = response.json().await.unwrap();
            assert_eq!(body["error"], "unavailable", "{path}");
        }
        // Only now may the instance's start end.
        proxy.release();
    };
    let (app, ()) = tokio::join!(starting, probed);
    assert_eq!(app.base, base);
    let voucher = app.open_voucher(1).await;
    app.assert_bought(&app.token(5).await, voucher).await;
}

#[tokio::test]
async fn a_database_migrated_by_another_version_is_refused_with_what_to_do() {
    // The last migration applied with other content, as by another
    // version of the service whose migration of that version differed.
    let app = spawn_app().await;
    sqlx::query(
        "UPDATE _sqlx_migrations SET checksum = '\\x00'
         WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let error = seckill::startup::Application::build(app.settings().clone())
        .await
        .err()
        .expect("the start is refused");
    let said = seckill::telemetry::Chain(&error).to_string();
    assert!(
        said.contains("migrations differ") && said.contains("DATABASE_URL"),
        "{said}"
    );
}

#[tokio::test]
async fn a_database_holding_another_programs_tables_is_refused_with_what_to_do() {
    // A database of another program (a `vouchers` table of its own, no
    // migrations of ours): the first migration cannot make its table.
    let name = format!("seckill_test_{}", uuid::Uuid::new_v4().simple());
    let server = crate::helpers::pg_server();
    let admin = sqlx::PgPool::connect(&format!("{server}/postgres"))
        .await
        .unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .unwrap();
    let url = format!("{server}/{name}");
    let other = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query("CREATE TABLE vouchers (code TEXT PRIMARY KEY)")
        .execute(&other)
        .await
        .unwrap();
    other.close().await;
    let settings = crate::helpers::settings(&url, &crate::helpers::redis_url(), "test:other:");
    let error = seckill::startup::Application::build(settings)
        .await
        .err()
        .expect("the start is refused");
    let said = seckill::telemetry::Chain(&error).to_string();
    sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&admin)
        .await
        .unwrap();
    assert!(
        said.contains("migrations differ")
            && said.contains("another program")
            && said.contains("DATABASE_URL"),
        "{said}"
    );
}
