//! The lab: each strategy's anomaly appears where it should and never
//! where it must not. Races that should happen are given enough users (and
//! rounds) to happen; stalls make the lease-expiry races happen on demand.
//! Every assertion is on the lab's rows.

use std::time::Duration;

use futures::future::join_all;
use reqwest::StatusCode;
use seckill::config::Settings;
use serde_json::{json, Value};

use crate::helpers::{
    post_purchase, spawn_app, spawn_app_mounting, OwnRedis, TestApp, ADMIN_TOKEN,
};

/// The lab locks' lease in these tests. Stalls and delays are fractions
/// and multiples of it, with half a lease of margin on every side.
const LEASE_MS: u64 = 500;

async fn lab_app() -> TestApp {
    lab_app_with(|s| s).await
}

/// A lab app with the settings adjusted first.
async fn lab_app_with(adjust: impl FnOnce(Settings) -> Settings) -> TestApp {
    spawn_app_mounting(adjust, Some(Duration::from_millis(LEASE_MS))).await
}

/// What a lab voucher's rows say.
type Rows = testkit::LabStats;

/// What the rows tell of a design.
trait Judged {
    fn oversold(&self) -> i64;
    fn duplicates(&self) -> i64;
    /// The bookkeeping itself never breaks: every unit taken has its order.
    fn assert_consistent(&self);
}

impl Judged for Rows {
    fn oversold(&self) -> i64 {
        (self.orders - self.initial_stock).max(0)
    }
    fn duplicates(&self) -> i64 {
        self.orders - self.distinct_users
    }
    #[track_caller]
    fn assert_consistent(&self) {
        assert_eq!(self.orders + self.stock, self.initial_stock, "{self:?}");
    }
}

/// `POST /admin/lab/vouchers` with this `stock` field, as the admin.
async fn post_lab_voucher(app: &TestApp, stock: Value) -> reqwest::Response {
    app.client
        .post(app.url("/admin/lab/vouchers"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "stock": stock }))
        .send()
        .await
        .expect("POST /admin/lab/vouchers")
}

fn admin(app: &TestApp) -> testkit::AdminApi {
    testkit::AdminApi::using(app.client.clone(), app.base.as_str(), ADMIN_TOKEN)
}

async fn lab_voucher(app: &TestApp, stock: i64) -> i64 {
    admin(app).lab_voucher(stock).await.expect("a lab voucher")
}

async fn rows(app: &TestApp, voucher: i64) -> Rows {
    admin(app)
        .lab_stats(voucher)
        .await
        .expect("a lab voucher's rows")
}

fn lab_url(base: &str, strategy: &str, voucher: i64, stall: Option<(&str, u64)>) -> String {
    let mut url = format!("{base}/lab/{strategy}/seckill/{voucher}");
    if let Some((at, ms)) = stall {
        url.push_str(&format!("?stall_at={at}&stall_ms={ms}"));
    }
    url
}

/// `users` users (ids from `first_user`) each send `per_user` purchases at
/// once, spread over `bases` in turn; returns the rows afterwards.
async fn crowd(
    app: &TestApp,
    bases: &[String],
    strategy: &str,
    users: i64,
    per_user: usize,
    stock: i64,
) -> Rows {
    let voucher = lab_voucher(app, stock).await;
    let tokens = app.tokens(1..=users).await;
    let mut requests = Vec::new();
    for (user, token) in &tokens {
        for i in 0..per_user {
            let base = &bases[(usize::try_from(*user).unwrap() + i) % bases.len()];
            requests.push((lab_url(base, strategy, voucher, None), token.clone()));
        }
    }
    let answers = join_all(
        requests
            .iter()
            .map(|(url, token)| post_purchase(&app.client, url, token)),
    )
    .await;
    for (status, code) in &answers {
        assert!(
            status.is_success()
                || ["sold_out", "already_purchased", "purchase_in_progress"]
                    .contains(&code.as_str()),
            "unexpected answer {status} {code}"
        );
    }
    rows(app, voucher).await
}

/// For each of `users` users, request A takes the guard and stalls for
/// 1.7 leases at `at`; request B of the same user starts 1.2 leases later
/// (after A's lease ran out, before A resumes) on the other instance if
/// there are two, retries while it is told "in progress", and stalls the
/// same way. Returns the rows afterwards.
async fn stalled_pairs(app: &TestApp, bases: &[String], strategy: &str, at: &str) -> Rows {
    let users = 8;
    let voucher = lab_voucher(app, 1_000).await;
    let tokens = app.tokens(1..=users).await;
    let stall = Some((at, LEASE_MS * 17 / 10));
    let a_url = lab_url(&bases[0], strategy, voucher, stall);
    let b_url = lab_url(&bases[bases.len() - 1], strategy, voucher, stall);
    let pairs = tokens.values().map(|token| {
        let (a_url, b_url, client) = (a_url.clone(), b_url.clone(), app.client.clone());
        async move {
            let a = post_purchase(&client, &a_url, token);
            let b = async {
                tokio::time::sleep(Duration::from_millis(LEASE_MS * 12 / 10)).await;
                let give_up = tokio::time::Instant::now() + Duration::from_millis(LEASE_MS * 4);
                loop {
                    let answer = post_purchase(&client, &b_url, token).await;
                    if answer.1 != "purchase_in_progress" || tokio::time::Instant::now() > give_up {
                        return answer;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            tokio::join!(a, b)
        }
    });
    join_all(pairs).await;
    rows(app, voucher).await
}

/// Runs `round` until `broke` says the anomaly showed, at most `rounds`
/// times, and fails the test if it never did; returns every round's rows
/// (the last one broke). Every round's bookkeeping must add up.
async fn until_seen<F, Fut>(
    rounds: usize,
    mut round: F,
    broke: impl Fn(&Rows) -> bool,
    anomaly: &str,
) -> Vec<Rows>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Rows>,
{
    let mut seen = Vec::new();
    for _ in 0..rounds {
        let rows = round().await;
        rows.assert_consistent();
        seen.push(rows);
        if broke(&rows) {
            return seen;
        }
    }
    panic!("{anomaly} never showed in {rounds} rounds: {seen:?}");
}

/// Crowds of 200 users for 20 units on one instance, 5 at most, until
/// `strategy` oversells: that crowd's stock is below zero.
async fn oversells_below_zero(app: &TestApp, strategy: &str) {
    let bases = [app.base.clone()];
    let seen = until_seen(
        5,
        || crowd(app, &bases, strategy, 200, 1, 20),
        |r| r.oversold() > 0,
        &format!("{strategy}'s oversell"),
    )
    .await;
    let last = seen.last().unwrap();
    assert!(last.stock < 0, "{last:?}");
}

/// `crowds` crowds of 200 users for 20 units over `bases`: `strategy` sells
/// each out exactly, no unit more, none left.
async fn sells_out_exactly(app: &TestApp, bases: &[String], strategy: &str, crowds: usize) {
    for _ in 0..crowds {
        let rows = crowd(app, bases, strategy, 200, 1, 20).await;
        rows.assert_consistent();
        assert_eq!((rows.orders, rows.stock), (20, 0), "{strategy}: {rows:?}");
    }
}

/// Crowds of 50 users with 4 purchases each at once for 1,000 units over
/// `bases`, 5 at most, until `strategy` sells some user two units.
async fn sells_one_user_twice(app: &TestApp, bases: &[String], strategy: &str, anomaly: &str) {
    until_seen(
        5,
        || crowd(app, bases, strategy, 50, 4, 1_000),
        |r| r.duplicates() > 0,
        anomaly,
    )
    .await;
}

#[tokio::test]
async fn lab_routes_exist_only_when_enabled() {
    let app = spawn_app().await;
    let token = app.token(1).await;
    let (status, code) = post_purchase(&app.client, &app.url("/lab/naive/seckill/1"), &token).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::NOT_FOUND, "not_found")
    );
    let (status, _) = app.admin_get("/lab").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let response = post_lab_voucher(&app, json!(1)).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert!(!has_lab_tables(&app).await, "no lab, no lab tables");
}

#[tokio::test]
async fn lab_rejects_bad_input_and_changes_nothing() {
    let app = lab_app().await;
    let created = post_lab_voucher(&app, json!(5)).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let voucher = created.json::<Value>().await.unwrap()["id"]
        .as_i64()
        .unwrap();
    let token = app.token(1).await;
    let before = rows(&app, voucher).await;
    // An unknown strategy, then each known one on a voucher that is not
    // there: 404; malformed ids and stalls: 400.
    let not_found = std::iter::once("/lab/nope/seckill/1".to_owned()).chain(
        ["naive", "stock_gt_zero", "lock_before_commit", "for_update"]
            .map(|strategy| format!("/lab/{strategy}/seckill/{}", voucher + 1)),
    );
    let bad_request = [
        "/lab/naive/seckill/abc".to_owned(),
        "/lab/naive/seckill/-1".to_owned(),
        format!("/lab/naive/seckill/{voucher}?stall_ms=x"),
        format!("/lab/naive/seckill/{voucher}?stall_ms=60001"),
        format!("/lab/naive/seckill/{voucher}?stall_ms=5&stall_at=lunch"),
        format!("/lab/naive/seckill/{voucher}?sleep=5"),
    ];
    for (path, want_status, want_code) in not_found
        .map(|path| (path, StatusCode::NOT_FOUND, "not_found"))
        .chain(
            bad_request
                .into_iter()
                .map(|path| (path, StatusCode::BAD_REQUEST, "bad_request")),
        )
    {
        let (status, code) = post_purchase(&app.client, &app.url(&path), &token).await;
        assert_eq!((status, code.as_str()), (want_status, want_code), "{path}");
    }
    let (status, code) = post_purchase(
        &app.client,
        &app.url(&format!("/lab/naive/seckill/{voucher}")),
        "forged",
    )
    .await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    for stock in [json!(-1), json!("ten"), json!(1u64 << 40)] {
        let response = post_lab_voucher(&app, stock.clone()).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{stock}");
    }
    let after = rows(&app, voucher).await;
    assert_eq!((after.orders, after.stock), (before.orders, before.stock));
    let vouchers: i64 = sqlx::query_scalar("SELECT count(*) FROM lab_vouchers")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(vouchers, 1);
    let (status, info) = app.admin_get("/lab").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(info["strategies"].as_array().unwrap().len(), 13);
    assert_eq!(info["lease_ms"], LEASE_MS);
}

#[tokio::test]
async fn naive_oversells_under_concurrency() {
    let app = lab_app().await;
    oversells_below_zero(&app, "naive").await;
    assert!(
        app.metrics()
            .await
            .contains(r#"seckill_lab_purchases_total{strategy="naive",outcome="ordered"}"#),
        "lab purchases are counted by strategy and outcome"
    );
}

#[tokio::test]
async fn version_undersells_while_buyers_are_refused() {
    let app = lab_app().await;
    let bases = [app.base.clone()];
    // As many buyers as units: every refusal leaves a unit unsold.
    let seen = until_seen(
        5,
        || crowd(&app, &bases, "version", 100, 1, 100),
        |r| r.stock > 0 && r.distinct_users < 100,
        "version's undersell",
    )
    .await;
    assert!(seen.iter().all(|r| r.oversold() == 0), "{seen:?}");
}

#[tokio::test]
async fn stock_gt_zero_never_oversells_but_sells_one_user_twice() {
    let app = lab_app().await;
    let bases = [app.base.clone()];
    // Scarce stock: no oversell, whatever the crowd.
    sells_out_exactly(&app, &bases, "stock_gt_zero", 3).await;
    // Plenty of stock, each user's requests at once: some user buys twice.
    sells_one_user_twice(&app, &bases, "stock_gt_zero", "a user buying twice").await;
}

#[tokio::test]
async fn lock_before_commit_sells_one_user_twice_on_one_instance() {
    let app = lab_app().await;
    let one = [app.base.clone()];
    // `stock > 0` under the row lock: the stock stays right.
    sells_out_exactly(&app, &one, "lock_before_commit", 2).await;
    // Each user's requests at once, on one instance: the next one takes
    // the mutex as the first gives it back, before the first commits.
    let seen = until_seen(
        5,
        || crowd(&app, &one, "lock_before_commit", 50, 4, 1_000),
        |r| r.duplicates() > 0,
        "a user buying twice on one instance",
    )
    .await;
    assert!(seen.iter().all(|r| r.oversold() == 0), "{seen:?}");
    // The same crowd with the lock held past the commit: nobody twice.
    let rows = crowd(&app, &one, "process_mutex", 50, 4, 1_000).await;
    assert_eq!(rows.duplicates(), 0, "process_mutex: {rows:?}");
}

#[tokio::test]
async fn for_update_sells_each_unit_once_and_each_user_once_under_a_crowd() {
    let app = lab_app().await;
    let one = [app.base.clone()];
    holds_without_a_stall(&app, &one, "for_update").await;
    let two = [app.base.clone(), app.spawn_instance().await];
    holds_without_a_stall(&app, &two, "for_update").await;
    // A crowd of 200 for 20 units, each user asking twice at once.
    let rows = crowd(&app, &two, "for_update", 200, 2, 20).await;
    rows.assert_consistent();
    assert_eq!(
        (rows.orders, rows.distinct_users, rows.stock),
        (20, 20, 0),
        "{rows:?}"
    );
}

#[tokio::test]
async fn process_mutex_holds_on_one_instance_and_fails_on_two() {
    let app = lab_app().await;
    let one = [app.base.clone()];
    for _ in 0..3 {
        let rows = crowd(&app, &one, "process_mutex", 50, 4, 1_000).await;
        assert_eq!(rows.duplicates(), 0, "one instance: {rows:?}");
    }
    let rows = stalled_pairs(&app, &one, "process_mutex", "sale").await;
    assert_eq!(rows.duplicates(), 0, "one instance, stalled: {rows:?}");

    let two = [app.base.clone(), app.spawn_instance().await];
    let rows = stalled_pairs(&app, &two, "process_mutex", "sale").await;
    assert!(rows.duplicates() > 0, "two instances, stalled: {rows:?}");
    let anomaly = "a user buying twice on two instances";
    sells_one_user_twice(&app, &two, "process_mutex", anomaly).await;
}

/// Without a stall a guarded strategy holds on two instances: no user
/// buys twice, no lock is deleted by another request, and scarce stock
/// sells out exactly.
async fn holds_without_a_stall(app: &TestApp, bases: &[String], strategy: &str) {
    for _ in 0..3 {
        let rows = crowd(app, bases, strategy, 50, 4, 1_000).await;
        assert_eq!(
            (rows.duplicates(), rows.foreign_releases),
            (0, 0),
            "{strategy}, no stall: {rows:?}"
        );
    }
    sells_out_exactly(app, bases, strategy, 1).await;
}

/// A `SET NX` lock without a stall holds on two instances; a stall past the
/// lease before the sale lets the user's next request buy too; a stall
/// before the delete makes it delete the next request's lock (`setnx`
/// because it never looks, `setnx_owner` because it looked too early).
async fn setnx_family(strategy: &str) {
    let app = lab_app().await;
    let two = [app.base.clone(), app.spawn_instance().await];
    holds_without_a_stall(&app, &two, strategy).await;
    let rows = stalled_pairs(&app, &two, strategy, "sale").await;
    rows.assert_consistent();
    assert!(rows.duplicates() > 0, "stall before the sale: {rows:?}");
    let rows = stalled_pairs(&app, &two, strategy, "release").await;
    assert!(
        rows.foreign_releases > 0,
        "stall before the delete: {rows:?}"
    );
    assert_eq!(rows.duplicates(), 0, "stall after the sale: {rows:?}");
}

#[tokio::test]
async fn setnx_breaks_under_a_stall_past_its_lease() {
    setnx_family("setnx").await;
}

#[tokio::test]
async fn setnx_owner_breaks_under_a_stall_past_its_lease() {
    setnx_family("setnx_owner").await;
}

#[tokio::test]
async fn reentrant_holds_except_when_a_stall_outlives_the_lease_before_the_sale() {
    let app = lab_app().await;
    let two = [app.base.clone(), app.spawn_instance().await];
    holds_without_a_stall(&app, &two, "reentrant").await;
    // The release script never deletes another owner's lock.
    let rows = stalled_pairs(&app, &two, "reentrant", "release").await;
    assert_eq!(
        (rows.foreign_releases, rows.duplicates()),
        (0, 0),
        "{rows:?}"
    );
    // But a lease cannot tell a stalled holder from a dead one.
    let rows = stalled_pairs(&app, &two, "reentrant", "sale").await;
    assert!(rows.duplicates() > 0, "stall before the sale: {rows:?}");
}

#[tokio::test]
async fn fenced_holds_in_every_case() {
    let app = lab_app().await;
    let two = [app.base.clone(), app.spawn_instance().await];
    holds_without_a_stall(&app, &two, "fenced").await;
    for at in ["sale", "release"] {
        let rows = stalled_pairs(&app, &two, "fenced", at).await;
        rows.assert_consistent();
        assert_eq!(
            (rows.duplicates(), rows.foreign_releases),
            (0, 0),
            "stall at {at}: {rows:?}"
        );
        assert_eq!(rows.distinct_users, 8, "every user bought once: {rows:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_answers_503_while_redis_is_away_and_recovers() {
    let mut redis = OwnRedis::start();
    let url = redis.url();
    let app = lab_app_with(|mut s| {
        s.redis_url = url;
        s
    })
    .await;
    let voucher = lab_voucher(&app, 10).await;
    let tokens = app.tokens(1..=4).await;
    let redis_strategies = ["setnx", "setnx_owner", "reentrant", "fenced"];

    redis.stop();
    for (strategy, user) in redis_strategies.iter().zip(1..) {
        let response = app
            .client
            .post(lab_url(&app.base, strategy, voucher, None))
            .bearer_auth(&tokens[&user])
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "{strategy}"
        );
        assert_eq!(response.headers()["retry-after"], "1", "{strategy}");
    }
    let rows_away = rows(&app, voucher).await;
    assert_eq!(
        (rows_away.orders, rows_away.stock),
        (0, 10),
        "nothing sold while away"
    );

    redis.restart();
    for (strategy, user) in redis_strategies.iter().zip(1..) {
        let mut answer = (StatusCode::SERVICE_UNAVAILABLE, String::new());
        // Bounded: the lock client reconnects on its own within seconds.
        for _ in 0..50 {
            answer = post_purchase(
                &app.client,
                &lab_url(&app.base, strategy, voucher, None),
                &tokens[&user],
            )
            .await;
            if answer.0 != StatusCode::SERVICE_UNAVAILABLE {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            answer.1.starts_with("ok:"),
            "{strategy} after recovery: {answer:?}"
        );
    }
    let after = rows(&app, voucher).await;
    after.assert_consistent();
    assert_eq!((after.orders, after.distinct_users), (4, 4));
}

/// The Redis stock of a lab voucher, from its stats.
async fn redis_stock(app: &TestApp, voucher: i64) -> i64 {
    let (status, body) = app
        .admin_get(&format!("/admin/lab/vouchers/{voucher}/stats"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["redis_stock"]
        .as_i64()
        .expect("a lab voucher has a Redis stock")
}

#[tokio::test]
async fn redis_decr_takes_the_redis_stock_below_zero_and_oversells() {
    let app = lab_app().await;
    oversells_below_zero(&app, "redis_decr").await;
}

#[tokio::test]
async fn redis_lua_holds_the_stock_and_the_user_under_a_crowd() {
    let app = lab_app().await;
    let bases = [app.base.clone()];
    let rows = crowd(&app, &bases, "redis_lua", 150, 3, 100).await;
    rows.assert_consistent();
    assert_eq!(
        (rows.orders, rows.distinct_users, rows.stock),
        (100, 100, 0)
    );
}

/// `users` users buy one unit each of a `users`-unit voucher with
/// `strategy`; every other user's request crashes between Redis and
/// Postgres. Returns the voucher, and the answers by status.
async fn crash_every_other(app: &TestApp, strategy: &str, users: i64) -> (i64, Vec<StatusCode>) {
    let voucher = lab_voucher(app, users).await;
    let tokens = app.tokens(1..=users).await;
    let answers = join_all(tokens.iter().map(|(user, token)| {
        let mut url = lab_url(&app.base, strategy, voucher, None);
        if user % 2 == 0 {
            url.push_str("?stall_at=crash");
        }
        let client = app.client.clone();
        async move { post_purchase(&client, &url, token).await.0 }
    }))
    .await;
    (voucher, answers)
}

#[tokio::test]
async fn a_crash_between_redis_and_postgres_loses_what_redis_lua_accepted() {
    let app = lab_app().await;
    let (voucher, answers) = crash_every_other(&app, "redis_lua", 20).await;
    let crashed = answers
        .iter()
        .filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert_eq!(crashed, 10, "{answers:?}");
    let rows = rows(&app, voucher).await;
    rows.assert_consistent();
    // Redis took all 20 units; Postgres got the 10 that did not crash.
    assert_eq!(redis_stock(&app, voucher).await, 0);
    assert_eq!(rows.orders, 10);
    // The 10 crashed users are Redis's buyers: they cannot buy again.
    let tokens = app.tokens(2..=2).await;
    let (status, code) = post_purchase(
        &app.client,
        &lab_url(&app.base, "redis_lua", voucher, None),
        &tokens[&2],
    )
    .await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::CONFLICT, "sold_out"),
        "the units are gone in Redis"
    );
}

#[tokio::test]
async fn a_writer_that_dies_mid_batch_loses_nothing_of_redis_stream() {
    let app = lab_app().await;
    let (voucher, answers) = crash_every_other(&app, "redis_stream", 20).await;
    assert!(
        answers.iter().all(|s| *s == StatusCode::ACCEPTED),
        "{answers:?}"
    );
    assert_eq!(redis_stock(&app, voucher).await, 0);
    // The first writer to read a marked order drops its batch unacknowledged;
    // a claim after the lease (500 ms) stores it.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let rows = loop {
        let rows = rows(&app, voucher).await;
        if rows.orders == 20 || std::time::Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    rows.assert_consistent();
    assert_eq!((rows.orders, rows.distinct_users, rows.stock), (20, 20, 0));
}

/// Whether the app's database holds the lab's tables.
async fn has_lab_tables(app: &TestApp) -> bool {
    sqlx::query_scalar::<_, bool>("SELECT to_regclass('lab_vouchers') IS NOT NULL")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_lab_tables_exist_only_where_the_lab_ran_and_such_a_database_still_starts_without_it() {
    let plain = spawn_app().await;
    assert!(
        !has_lab_tables(&plain).await,
        "a database the service migrates has no lab tables"
    );
    let lab = lab_app().await;
    assert!(has_lab_tables(&lab).await);
    // The database now lists the lab's migration, which the service's own
    // set lacks (as a database migrated by an earlier version does): an
    // instance without the lab still starts on it, and sells.
    let without = lab.spawn_instance_with(lab.settings()).await;
    let voucher = lab.open_voucher(1).await;
    let token = lab.token(1).await;
    let (status, _) = crate::helpers::buy(&lab.client, &without, &token, voucher).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = lab
        .client
        .get(format!("{without}/readyz"))
        .send()
        .await
        .map(|r| (r.status(), ()))
        .unwrap();
    assert_eq!(status, StatusCode::OK);
}
