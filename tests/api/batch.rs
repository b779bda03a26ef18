//! Group commit: the batch sale statement's answer per purchase, and the
//! batcher's edges through the API (lapsed leases, a frozen Postgres, a
//! client that leaves while its batch commits, one order per transaction).

use std::collections::HashMap;
use std::time::Duration;

use reqwest::StatusCode;
use seckill::domain::{FencingToken, OrderId, Quantity, UserId, VoucherId};
use seckill::store::{Sale, SaleRequest, Store};
use tokio::task::JoinSet;

use crate::helpers::{buy, client, crowd, spawn_app, spawn_app_with, TestApp};
use crate::proxy::{spawn_app_behind_pg_proxy, spawn_app_behind_pg_proxy_timing_out};

fn store(app: &TestApp) -> Store {
    Store::from_pool(app.db.clone(), Duration::from_secs(10))
}

fn order(id: i64) -> OrderId {
    OrderId::from_stored(id).unwrap()
}

/// One purchase of `voucher` by each of `users`, all at once.
fn buyers(
    app: &TestApp,
    tokens: &HashMap<i64, String>,
    voucher: i64,
    users: impl IntoIterator<Item = i64>,
) -> JoinSet<(StatusCode, String)> {
    let client = client();
    let mut tasks = JoinSet::new();
    for user in users {
        let (client, base, token) = (client.clone(), app.base.clone(), tokens[&user].clone());
        tasks.spawn(async move { buy(&client, &base, &token, voucher).await });
    }
    tasks
}

/// Requests for these users, with ids and fences of their own.
fn requests(users: impl IntoIterator<Item = i64>, first_id: i64) -> Vec<SaleRequest> {
    users
        .into_iter()
        .enumerate()
        .map(|(i, user_id)| SaleRequest {
            order_id: order(first_id + i as i64),
            user_id: UserId::new(user_id).unwrap(),
            fence: Some(FencingToken::new(1_000)),
            at: chrono::Utc::now(),
            quantity: Quantity::ONE,
        })
        .collect()
}

#[tokio::test]
async fn a_batch_larger_than_the_stock_sells_the_stock_first_come_first_served() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(3).await;
    let sold = store(&app)
        .sell_batch(
            VoucherId::new(voucher).unwrap(),
            3,
            &requests([5, 4, 3, 2, 1], 1 << 40),
        )
        .await
        .unwrap();
    assert_eq!(
        sold.sales,
        [
            Sale::Sold,
            Sale::Sold,
            Sale::Sold,
            Sale::SoldOut,
            Sale::SoldOut
        ]
    );
    let level = sold.level.unwrap();
    assert_eq!((level.stock, level.initial_stock), (0, 3));
    let buyers: Vec<i64> = sqlx::query_scalar(
        "SELECT user_id FROM voucher_orders WHERE voucher_id = $1 ORDER BY user_id",
    )
    .bind(voucher)
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(buyers, [3, 4, 5], "the first three in the batch bought");
    assert_eq!(app.check_invariants(voucher).await, 3);

    // Sold out: nothing decremented, nothing to report as the stock.
    let after = store(&app)
        .sell_batch(VoucherId::new(voucher).unwrap(), 3, &requests([6], 2 << 40))
        .await
        .unwrap();
    assert_eq!(after.sales, [Sale::SoldOut]);
    assert_eq!(after.level, None);
}

/// `requests` for these users, each asking for its number of units.
fn asking(asks: &[(i64, i32)], first_id: i64) -> Vec<SaleRequest> {
    let mut batch = requests(asks.iter().map(|(user, _)| *user), first_id);
    for (request, (_, units)) in batch.iter_mut().zip(asks) {
        request.quantity = Quantity::within(i64::from(*units), Quantity::MAX).unwrap();
    }
    batch
}

#[tokio::test]
async fn a_batch_serves_asks_whole_in_arrival_order_and_one_it_cannot_cover_does_not_stop_a_smaller_one(
) {
    let app = spawn_app().await;
    let voucher = app.open_voucher(3).await;
    let store = store(&app);
    let id = VoucherId::new(voucher).unwrap();
    // 3 left, asks of 2, 2 and 1: the first and the third, all or nothing.
    let sold = store
        .sell_batch(id, 3, &asking(&[(1, 2), (2, 2), (3, 1)], 11 << 40))
        .await
        .unwrap();
    assert_eq!(sold.sales, [Sale::Sold, Sale::SoldOut, Sale::Sold]);
    assert_eq!(sold.level.unwrap().stock, 0);
    let units: Vec<(i64, i32)> = sqlx::query_as(
        "SELECT user_id, quantity FROM voucher_orders WHERE voucher_id = $1 ORDER BY user_id",
    )
    .bind(voucher)
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(units, [(1, 2), (3, 1)], "nobody got part of an ask");

    // Some left, fewer than asked: `short`, with what is left after the
    // batch; a buyer who fits is still served.
    let voucher = app.open_voucher(4).await;
    let id = VoucherId::new(voucher).unwrap();
    let sold = store
        .sell_batch(id, 3, &asking(&[(1, 3), (2, 3), (3, 2)], 12 << 40))
        .await
        .unwrap();
    assert_eq!(sold.sales, [Sale::Sold, Sale::Short(1), Sale::Short(1)]);
    assert_eq!(sold.level.unwrap().stock, 1);
    // Asking again for what is left is served; then none is left.
    let again = store
        .sell_batch(id, 3, &asking(&[(2, 1), (3, 1)], 13 << 40))
        .await
        .unwrap();
    assert_eq!(again.sales, [Sale::Sold, Sale::SoldOut]);
    assert_eq!(app.check_invariants(voucher).await, 2, "orders of 3 and 1");
}

#[tokio::test]
async fn a_batch_answers_holders_stale_fences_and_taken_ids_each_on_its_own() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(10).await;
    let store = store(&app);
    // User 1 buys first; user 2's lock has moved on to token 5,000.
    let first = store
        .sell_batch(VoucherId::new(voucher).unwrap(), 3, &requests([1], 7 << 40))
        .await
        .unwrap();
    assert_eq!(first.sales, [Sale::Sold]);
    let mut fresh = requests([2], 8 << 40);
    fresh[0].fence = Some(FencingToken::new(5_000));
    assert_eq!(
        store
            .sell_batch(VoucherId::new(voucher).unwrap(), 3, &fresh)
            .await
            .unwrap()
            .sales,
        [Sale::Sold]
    );

    // One batch: user 1 again, user 2 with a stale token, user 3 under an
    // id that is taken, user 4 as it should be.
    let mut batch = requests([1, 2, 3, 4], 9 << 40);
    batch[1].fence = Some(FencingToken::new(4_000));
    batch[2].order_id = order(7 << 40);
    let sold = store
        .sell_batch(VoucherId::new(voucher).unwrap(), 3, &batch)
        .await
        .unwrap();
    assert_eq!(
        sold.sales,
        [
            Sale::Held(order(7 << 40)),
            Sale::Fenced,
            Sale::IdTaken,
            Sale::Sold
        ]
    );
    assert_eq!(sold.level.unwrap().stock, 7);
    assert_eq!(app.check_invariants(voucher).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_whose_leases_lapse_at_once_still_gets_one_order() {
    // A one-millisecond lease: the lock no longer keeps a user's purchases
    // apart, so they meet in one batch; the batch and the unique index do.
    let app = spawn_app_with(|mut s| {
        s.lock_lease = Duration::from_millis(1);
        s
    })
    .await;
    let voucher = app.open_voucher(10).await;
    let tokens = app.tokens([9]).await;
    let answers = crowd(&[&app.base], &tokens, voucher, 60).await;
    let orders: Vec<_> = answers.iter().filter(|a| a.2.starts_with("ok:")).collect();
    assert_eq!(orders.len(), 1, "{answers:?}");
    for (_, status, code) in &answers {
        assert!(
            code.starts_with("ok:")
                || ["already_purchased", "purchase_in_progress"].contains(&code.as_str()),
            "{status} {code}"
        );
    }
    assert_eq!(app.check_invariants(voucher).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_on_a_frozen_postgres_answers_503_to_all_and_commits_nothing_halfway() {
    let (app, proxy) = spawn_app_behind_pg_proxy_timing_out(700).await;
    let (voucher, tokens) = app.warm_sale(100, 40).await;

    proxy.freeze();
    let answers = buyers(&app, &tokens, voucher, 2..=40).join_all().await;
    proxy.thaw();
    for answer in &answers {
        assert_eq!(answer.0, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
    }
    // What reached Postgres before the freeze ran as whole batches: the
    // books balance whatever committed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    app.check_invariants(voucher).await;
}

/// A crowd larger than the units left does not queue at the users' locks:
/// while Postgres holds the first batch, only as many purchases as there
/// are units left go on to their locks; the rest wait at the gate for
/// their outcome and are told "sold out" without ever taking a lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_beyond_the_units_left_waits_at_the_gate_instead_of_taking_locks() {
    let (app, proxy) = spawn_app_behind_pg_proxy(|s| s).await;
    let (voucher, tokens) = app.warm_sale(5, 51).await; // 4 units left

    proxy.freeze();
    let tasks = buyers(&app, &tokens, voucher, 2..=51);
    // Every request is in by now: four at their locks and batches (held
    // by Postgres), the rest at the gate.
    tokio::time::sleep(Duration::from_millis(400)).await;
    proxy.thaw();
    let answers = tasks.join_all().await;
    let sold = answers.iter().filter(|a| a.1.starts_with("ok:")).count();
    assert_eq!(sold, 4, "{answers:?}");
    for (status, code) in &answers {
        assert!(
            code.starts_with("ok:") || code == "sold_out",
            "{status} {code}"
        );
    }
    assert_eq!(app.check_invariants(voucher).await, 5);

    // A user who took the lock left its fencing-token key: user 1 (the warm
    // purchase) and the four who bought, none of the 46 refused.
    let mut conn = testkit::redis_conn(&testkit::redis_url()).await;
    let fences: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*order:*:fence", app.keyspace().await))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(fences.len(), 5, "users who took their lock: {fences:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_whose_client_left_while_its_batch_committed_stands() {
    let (app, proxy) = spawn_app_behind_pg_proxy(|s| s).await;
    let (voucher, tokens) = app.warm_sale(5, 2).await;

    // Postgres stalls while user 2's batch is on its way; the client gives
    // up; Postgres resumes within the service's deadline and commits.
    proxy.freeze();
    let gave_up = app
        .impatient_purchase(voucher, &tokens[&2], Duration::from_millis(300))
        .await;
    assert!(gave_up.is_err(), "the client was to give up: {gave_up:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.thaw();

    // Its retry is as good as the lost answer.
    let mut retry = (StatusCode::OK, String::new());
    for _ in 0..50 {
        let response = app
            .client
            .post(app.url(&format!("/seckill/{voucher}")))
            .bearer_auth(&tokens[&2])
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: serde_json::Value = response.json().await.unwrap();
        if status == StatusCode::TOO_MANY_REQUESTS {
            // The lost request's lock is still being released.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        retry = (status, body.to_string());
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"], "already_purchased");
        let order_id = body["order_id"].as_str().unwrap().to_owned();
        let (status, order) = app.admin_get(&format!("/orders/{order_id}")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(order["user_id"], 2);
        break;
    }
    assert_eq!(
        retry.0,
        StatusCode::CONFLICT,
        "never saw the order: {retry:?}"
    );
    assert_eq!(app.check_invariants(voucher).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_order_per_transaction_still_holds_every_invariant() {
    let app = spawn_app_with(|mut s| {
        s.sale_batch_max = 1;
        s
    })
    .await;
    let second = app.spawn_instance().await;
    let voucher = app.open_voucher(30).await;
    let tokens = app.tokens(1..=80).await;
    let answers = crowd(&[&app.base, &second], &tokens, voucher, 1).await;
    let sold = answers.iter().filter(|a| a.2.starts_with("ok:")).count();
    assert_eq!(sold, 30, "{answers:?}");
    assert_eq!(app.check_invariants(voucher).await, 30);
    let metrics = app.metrics().await;
    for series in [
        "seckill_sale_batch_size_bucket",
        "seckill_sale_commit_seconds_bucket",
    ] {
        assert!(metrics.contains(series), "no {series} in /metrics");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_every_background_worker_within_its_timeout() {
    use crate::helpers::{create_voucher_at, drop_database, pg_server, redis_url, tokens_at};
    use serde_json::json;

    let db_name = format!("seckill_test_{}", uuid::Uuid::new_v4().simple());
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let db_url = format!("{}/{db_name}", pg_server());
    let mut settings = crate::helpers::settings(&db_url, &redis_url(), &prefix);
    settings.shutdown_timeout = Duration::from_millis(5_000);
    let app = seckill::startup::Application::build(settings)
        .await
        .expect("the app builds");
    let seckill = app.seckill().clone();
    let base = format!("http://{}", app.local_addr());
    let (stop, signal) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(app.run_until(async move {
        let _ = signal.await;
    }));
    let client = client();
    // A sync sale and an async one: each gets a writer of its own (the
    // sync one a locker too, the async one an acceptor), beside the expiry
    // sweep, the relay of returns, the async supervisor and the deletion
    // of old order events.
    let now = chrono::Utc::now();
    let voucher = |mode: &str| {
        json!({
            "title": "shutdown", "stock": 10, "sale_mode": mode,
            "begin_time": now - chrono::Duration::minutes(1),
            "end_time": now + chrono::Duration::hours(1),
        })
    };
    let sync = create_voucher_at(&client, &base, voucher("sync")).await;
    let async_sale = create_voucher_at(&client, &base, voucher("async")).await;
    let tokens = tokens_at(&client, &base, [1, 2]).await;
    let (status, _) = buy(&client, &base, &tokens[&1], sync).await;
    assert_eq!(status, StatusCode::OK);
    let accepted = crate::helpers::send_purchase(
        &client,
        &format!("{base}/seckill/{async_sale}"),
        &tokens[&2],
    )
    .await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.body);
    let started = std::time::Instant::now();
    while seckill.workers_running() < 9 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the workers did not start: {}",
            seckill.workers_running()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let stopping = std::time::Instant::now();
    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    assert!(
        stopping.elapsed() < Duration::from_secs(6),
        "shutdown took {:?}",
        stopping.elapsed()
    );
    assert_eq!(seckill.workers_running(), 0, "a worker outlived shutdown");
    // The accepted async order was written before its writer stopped.
    let db = sqlx::PgPool::connect(&db_url).await.unwrap();
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM voucher_orders WHERE voucher_id = $1")
            .bind(async_sale)
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(stored, 1);
    db.close().await;
    drop_database(&db_name, &prefix).await;
}
