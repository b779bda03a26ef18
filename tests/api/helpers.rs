//! Test harness: each test gets its own database, its own Redis key prefix
//! and its own app on a free port; all are removed when the test ends.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use seckill::config::Settings;
use seckill::startup::Application;
use serde_json::{json, Value};
use sqlx::PgPool;
pub use testkit::{
    command_calls, delete_keys, drop_database, pg_server, redis_conn, redis_url, OwnRedis,
    ServiceProcess,
};
use uuid::Uuid;

// Secrets as the service takes them: 32 bytes at least, no placeholder.
pub const ADMIN_TOKEN: &str = "test-admin-token-9f3c1b7e5a2d4c68e0b1";
pub const TOKEN_SECRET: &str = "test-token-secret-4e8a0c2f6b1d9e3a7c5b";
pub const PAYMENT_SECRET: &str = "test-payment-secret-7d2b5f9a1c3e8b6d0a4f";

/// Settings for one test app; `db_url` and `redis_url` say where to go.
pub fn settings(db_url: &str, redis_url: &str, prefix: &str) -> Settings {
    let mut args = vec!["--addr".to_owned(), "127.0.0.1:0".to_owned()];
    args.extend(setting_args(db_url, redis_url, prefix));
    Settings::from_args(args).expect("test settings parse")
}

/// The command-line flags of a test app but its address (also of one run
/// as a process, whose address `testkit::ServiceProcess` gives).
pub fn setting_args(db_url: &str, redis_url: &str, prefix: &str) -> Vec<String> {
    [
        "--database-url",
        db_url,
        "--redis-url",
        redis_url,
        "--redis-prefix",
        prefix,
        "--admin-token",
        ADMIN_TOKEN,
        "--token-secret",
        TOKEN_SECRET,
        "--payment-secret",
        PAYMENT_SECRET,
        "--pg-pool",
        "8",
        // Generous: tests run side by side on two cores. The tests of
        // deadlines set their own.
        "--dependency-timeout-ms",
        "5000",
        "--startup-wait-ms",
        "0",
        // Tests send many requests from one address and one user; those of
        // the limits set their own.
        "--limit-per-address",
        "0",
        "--limit-per-user",
        "0",
        // A test's client runs on the app's own runtime, beside other
        // tests on two cores: the queueing delay says more of them than of
        // the app. The shedder's tests set their own.
        "--shed-delay-ms",
        "0",
    ]
    .map(str::to_owned)
    .to_vec()
}

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub db_name: String,
    pub prefix: String,
    pub db: PgPool,
    settings: Settings,
    /// The lease of the lab's locks, where the lab is mounted.
    lab: Option<Duration>,
    /// Every instance serving this app's database and keys: stopped before
    /// they are removed, so that none writes a key after the clean-up.
    running: std::sync::Mutex<Vec<Stoppable>>,
}

/// A fresh database and Redis prefix, and an app serving them.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|s| s).await
}

/// An app on the Redis at `url` (a test's own), with a dependency deadline
/// of `timeout_ms` when given.
pub async fn spawn_app_on_redis(url: String, timeout_ms: Option<u64>) -> TestApp {
    spawn_app_with(|mut s| {
        s.redis_url = url;
        if let Some(ms) = timeout_ms {
            s.dependency_timeout = Duration::from_millis(ms);
        }
        s
    })
    .await
}

/// A private `redis-server` and an app on it (dependency deadline
/// `timeout_ms` if given): for tests that restart or stop Redis.
pub async fn spawn_app_on_own_redis(timeout_ms: Option<u64>) -> (OwnRedis, TestApp) {
    let redis = OwnRedis::start();
    let app = spawn_app_on_redis(redis.url(), timeout_ms).await;
    (redis, app)
}

/// Like [`spawn_app`], with the settings adjusted first (the database URL
/// in them names the fresh database).
pub async fn spawn_app_with(adjust: impl FnOnce(Settings) -> Settings) -> TestApp {
    spawn_app_mounting(adjust, None).await
}

/// Like [`spawn_app_with`], with the lab mounted (its locks' lease `lab`)
/// when given, on this instance and every other it spawns.
pub async fn spawn_app_mounting(
    adjust: impl FnOnce(Settings) -> Settings,
    lab: Option<Duration>,
) -> TestApp {
    let db_name = format!("seckill_test_{}", Uuid::new_v4().simple());
    let db_url = format!("{}/{db_name}", pg_server());
    let prefix = format!("test:{}:", Uuid::new_v4().simple());
    let settings = adjust(settings(&db_url, &redis_url(), &prefix));
    let first = start_stoppable_mounting(settings.clone(), lab).await;
    let db = PgPool::connect(&db_url)
        .await
        .expect("the test database answers");
    TestApp {
        base: first.base.clone(),
        client: client(),
        db_name,
        prefix,
        db,
        settings,
        lab,
        running: std::sync::Mutex::new(vec![first]),
    }
}

/// Asserts that the service refuses to start with `settings`, and that
/// its error names `variable`, the setting at fault.
pub async fn assert_refused_to_start(settings: Settings, variable: &str) {
    let error = Application::build(settings).await.err().unwrap();
    assert!(error.to_string().contains(variable), "{error}");
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client")
}

/// A running app whose shutdown the test triggers: `stop` starts it, and
/// `stopped` ends when `run_until` returned.
pub struct Stoppable {
    pub base: String,
    pub stop: tokio::sync::oneshot::Sender<()>,
    pub stopped: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Builds and serves an app on this test's runtime that stops when the
/// test says so.
pub async fn start_stoppable(settings: Settings) -> Stoppable {
    start_stoppable_mounting(settings, None).await
}

/// Like [`start_stoppable`], with the lab mounted (its locks' lease `lab`)
/// when given.
pub async fn start_stoppable_mounting(settings: Settings, lab: Option<Duration>) -> Stoppable {
    let mut app = Application::build(settings).await.expect("the app builds");
    if let Some(lease) = lab {
        let lab = seckill_lab::mount(&app, lease)
            .await
            .expect("the lab mounts");
        app.mount(lab);
    }
    let addr: SocketAddr = app.local_addr();
    let base = format!("http://{addr}");
    let (stop, signal) = tokio::sync::oneshot::channel::<()>();
    let stopped = tokio::spawn(app.run_until(async move {
        let _ = signal.await;
    }));
    Stoppable {
        base,
        stop,
        stopped,
    }
}

impl TestApp {
    /// Buys one unit of `voucher` with `token`, and fails the test unless
    /// the order was committed.
    pub async fn assert_bought(&self, token: &str, voucher: i64) {
        let (status, answer) = buy(&self.client, &self.base, token, voucher).await;
        assert!(answer.starts_with("ok:"), "{status}: {answer}");
    }

    /// A voucher on sale with `stock` units, tokens for users 1 to `users`,
    /// and user 1's order bought: the voucher's window is cached and the
    /// connections are open.
    pub async fn warm_sale(&self, stock: i64, users: i64) -> (i64, HashMap<i64, String>) {
        let voucher = self.open_voucher(stock).await;
        let tokens = self.tokens(1..=users).await;
        self.assert_bought(&tokens[&1], voucher).await;
        (voucher, tokens)
    }

    /// After a failover: buys one unit of `voucher` as user `*user`, then
    /// the next user, ... (user `u` through `bases[u % bases.len()]`), a
    /// `pause` apart, until a purchase is answered 200 within `bound`;
    /// every answer before it is 503, never a 500. `*user` is left at the
    /// first user not yet used. Returns how long it took and how many 503s.
    pub async fn buy_until_resumed(
        &self,
        bases: &[&str],
        tokens: &HashMap<i64, String>,
        voucher: i64,
        user: &mut i64,
        bound: Duration,
        pause: Duration,
    ) -> (Duration, usize) {
        let started = std::time::Instant::now();
        let mut unavailable = 0;
        loop {
            assert!(
                started.elapsed() < bound,
                "sales did not resume after the failover ({unavailable} answers 503)"
            );
            let base = bases[usize::try_from(*user).unwrap() % bases.len()];
            let (status, code) = buy(&self.client, base, &tokens[user], voucher).await;
            *user += 1;
            assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR, "{code}");
            if status == StatusCode::OK {
                return (started.elapsed(), unavailable);
            }
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{code}");
            unavailable += 1;
            tokio::time::sleep(pause).await;
        }
    }

    /// Waits (bounded) until `/readyz` answers 200 again.
    pub async fn wait_ready(&self) {
        for _ in 0..150 {
            if let Ok(r) = self.client.get(self.url("/readyz")).send().await {
                if r.status() == StatusCode::OK {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the service did not become ready again");
    }

    /// Kills `redis` (this app's own) and starts it again empty, waits until
    /// the service is ready again (its connection finds the new Redis on its
    /// own; until it has, a reconcile is answered 503 like any call that
    /// needs Redis), then reconciles `voucher`'s async sale from Postgres and
    /// asserts that was answered 200: the reconcile's report.
    pub async fn reconcile_after_empty_redis(&self, redis: &mut OwnRedis, voucher: i64) -> Value {
        redis.stop();
        redis.restart();
        self.wait_ready().await;
        let (status, report) = self.reconcile(voucher).await;
        assert_eq!(status, StatusCode::OK, "{report}");
        report
    }

    /// The settings this app was built with.
    pub fn settings(&self) -> Settings {
        self.settings.clone()
    }

    /// Another instance of the service on the same database and Redis.
    pub async fn spawn_instance(&self) -> String {
        self.keep(start_stoppable_mounting(self.settings.clone(), self.lab).await)
    }

    /// Another instance on `settings` (this app's, changed), without the
    /// lab.
    pub async fn spawn_instance_with(&self, settings: Settings) -> String {
        self.keep(start_stoppable(settings).await)
    }

    /// `instance`'s base URL; it is stopped with this app.
    fn keep(&self, instance: Stoppable) -> String {
        let base = instance.base.clone();
        self.running.lock().unwrap().push(instance);
        base
    }

    /// The prefix of every Redis key this app writes: the test's prefix and
    /// the database's namespace.
    pub async fn keyspace(&self) -> String {
        let namespace: Uuid = sqlx::query_scalar("SELECT namespace FROM deployment")
            .fetch_one(&self.db)
            .await
            .unwrap();
        format!("{}{}:", self.prefix, namespace.simple())
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn create_voucher(
        &self,
        stock: i64,
        begin: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> i64 {
        self.create_voucher_from(
            json!({ "title": "test voucher", "stock": stock, "begin_time": begin, "end_time": end }),
        )
        .await
    }

    /// Creates a voucher from a whole `POST /admin/vouchers` body.
    pub async fn create_voucher_from(&self, body: Value) -> i64 {
        create_voucher_at(&self.client, &self.base, body).await
    }

    /// A voucher on sale from a minute ago for an hour.
    pub async fn open_voucher(&self, stock: i64) -> i64 {
        self.open_voucher_with(stock, json!({})).await
    }

    /// An async voucher on sale from a minute ago for an hour.
    pub async fn open_async_voucher(&self, stock: i64) -> i64 {
        self.open_voucher_with(stock, json!({ "sale_mode": "async" }))
            .await
    }

    /// A voucher on sale from a minute ago for an hour, with the fields of
    /// `extra` (an object) added to its `POST /admin/vouchers` body.
    pub async fn open_voucher_with(&self, stock: i64, extra: Value) -> i64 {
        let now = Utc::now();
        let mut body = json!({
            "title": "test voucher",
            "stock": stock,
            "begin_time": now - chrono::Duration::minutes(1),
            "end_time": now + chrono::Duration::hours(1),
        });
        body.as_object_mut().unwrap().extend(
            extra
                .as_object()
                .expect("extra fields are an object")
                .clone(),
        );
        self.create_voucher_from(body).await
    }

    /// Tokens for these users, minted through the admin API.
    pub async fn tokens(&self, user_ids: impl IntoIterator<Item = i64>) -> HashMap<i64, String> {
        tokens_at(&self.client, &self.base, user_ids).await
    }

    pub async fn token(&self, user_id: i64) -> String {
        self.tokens([user_id]).await.remove(&user_id).unwrap()
    }

    pub async fn admin_get(&self, path: &str) -> (StatusCode, Value) {
        self.get_as(path, ADMIN_TOKEN).await
    }

    /// `GET path` with `token`: the status and the JSON body (null if none).
    pub async fn get_as(&self, path: &str, token: &str) -> (StatusCode, Value) {
        answer(self.client.get(self.url(path)).bearer_auth(token)).await
    }

    /// `POST path` with `token` and no body: the status and the JSON body
    /// (null if none).
    pub async fn post_as(&self, path: &str, token: &str) -> (StatusCode, Value) {
        answer(self.client.post(self.url(path)).bearer_auth(token)).await
    }

    /// `POST /seckill/{voucher}` with `token` from a client that gives up
    /// after `patience`: its error if it gave up, else the answer.
    pub async fn impatient_purchase(
        &self,
        voucher: i64,
        token: &str,
        patience: Duration,
    ) -> reqwest::Result<reqwest::Response> {
        let impatient = reqwest::Client::builder()
            .timeout(patience)
            .build()
            .unwrap();
        impatient
            .post(self.url(&format!("/seckill/{voucher}")))
            .bearer_auth(token)
            .send()
            .await
    }

    /// The `/metrics` page as text.
    pub async fn metrics(&self) -> String {
        let response = self.client.get(self.url("/metrics")).send().await;
        response.expect("GET /metrics").text().await.unwrap()
    }

    pub async fn stats(&self, voucher_id: i64) -> Value {
        let (status, body) = self
            .admin_get(&format!("/admin/vouchers/{voucher_id}/stats"))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    /// Row counts and the stock sum: equal before and after a request that
    /// must change nothing.
    pub async fn snapshot(&self) -> (i64, i64, i64, i64) {
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM vouchers), (SELECT count(*) FROM seckill_vouchers),
                    (SELECT count(*) FROM voucher_orders),
                    (SELECT coalesce(sum(stock), 0) + coalesce(sum(initial_stock), 0) FROM seckill_vouchers)",
        )
        .fetch_one(&self.db)
        .await
        .unwrap()
    }

    /// Locks the voucher's row in a transaction of the test's own, so that
    /// a purchase's batch waits for it until the transaction ends.
    pub async fn lock_voucher_row(
        &self,
        voucher_id: i64,
    ) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut blocker = self.db.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM seckill_vouchers WHERE voucher_id = $1 FOR UPDATE")
            .bind(voucher_id)
            .execute(&mut *blocker)
            .await
            .unwrap();
        blocker
    }

    /// A session to the app's database opened as the service opens its
    /// own (`seckill::store::session_options`): for a test that plays an
    /// instance's session.
    pub async fn service_session(&self) -> sqlx::PgConnection {
        let pool = seckill::startup::pool_settings(&self.settings);
        let options = seckill::store::session_options(&self.settings.database_url, &pool).unwrap();
        sqlx::ConnectOptions::connect(&options).await.unwrap()
    }

    /// Checks the contract's invariants for a voucher straight in the
    /// database; returns the number of live (`unpaid` or `paid`) orders.
    pub async fn check_invariants(&self, voucher_id: i64) -> i64 {
        let mut conn = self.db.acquire().await.unwrap();
        let books = testkit::Books::read(&mut conn, voucher_id).await.unwrap();
        let problems = books.problems();
        assert!(problems.is_empty(), "{books:?}: {}", problems.join("; "));
        books.orders
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let db_name = self.db_name.clone();
        let prefix = self.prefix.clone();
        let running = std::mem::take(&mut *self.running.lock().unwrap_or_else(|e| e.into_inner()));
        // The instances run on the test's runtime. With worker threads, they
        // go on while this thread waits here: stop them and wait (bounded)
        // until they have, or one (an async sale's writer, say) may write a
        // key after the clean-up. A runtime on this thread alone runs none
        // of them until this returns, and ends with the test.
        let wait = tokio::runtime::Handle::try_current().is_ok_and(|runtime| {
            runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
        });
        let stopped: Vec<_> = running
            .into_iter()
            .map(|instance| {
                let _ = instance.stop.send(());
                instance.stopped
            })
            .collect();
        // Drop cannot await, and this test's runtime is busy unwinding or
        // ending: clean up on a runtime of our own.
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                if wait {
                    let all = futures_util::future::join_all(stopped);
                    let _ = tokio::time::timeout(Duration::from_secs(15), all).await;
                }
                drop_database(&db_name, &prefix).await;
            });
        });
        let _ = cleanup.join();
    }
}

/// Sends `request`: the status and the JSON body (null if none).
pub async fn answer(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.expect("the request was sent");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Creates a voucher on the service at `base` from a whole `POST
/// /admin/vouchers` body; its id.
pub async fn create_voucher_at(client: &reqwest::Client, base: &str, body: Value) -> i64 {
    testkit::AdminApi::using(client.clone(), base, ADMIN_TOKEN)
        .create_voucher_from(&body)
        .await
        .expect("create voucher")
}

/// Sends `POST /seckill/{voucher}` and returns the status and the error
/// code (or `"ok"` with the order id).
pub async fn buy(
    client: &reqwest::Client,
    base: &str,
    token: &str,
    voucher_id: i64,
) -> (StatusCode, String) {
    post_purchase(client, &format!("{base}/seckill/{voucher_id}"), token).await
}

/// A crowd at once: every user of `tokens` sends `per_user` purchases of
/// `voucher_id`, the users dealt in turn to the instances at `bases`, and
/// each user's next purchase to the next instance. The answers as
/// (user, status, code), in the order they came.
pub async fn crowd(
    bases: &[&str],
    tokens: &HashMap<i64, String>,
    voucher_id: i64,
    per_user: usize,
) -> Vec<(i64, StatusCode, String)> {
    let client = client();
    let mut tasks = tokio::task::JoinSet::new();
    for round in 0..per_user {
        for (i, (&user, token)) in tokens.iter().enumerate() {
            let base = bases[(i + round) % bases.len()].to_owned();
            let (client, token) = (client.clone(), token.clone());
            tasks.spawn(async move {
                let (status, code) = buy(&client, &base, &token, voucher_id).await;
                (user, status, code)
            });
        }
    }
    tasks.join_all().await
}

/// How one purchase was answered.
pub struct Answer {
    pub status: StatusCode,
    pub retry_after: Option<String>,
    pub body: Value,
    pub took: Duration,
}

/// Tokens for these users, minted through the admin API of the instance
/// at `base`.
pub async fn tokens_at(
    client: &reqwest::Client,
    base: &str,
    user_ids: impl IntoIterator<Item = i64>,
) -> HashMap<i64, String> {
    let ids: Vec<i64> = user_ids.into_iter().collect();
    let tokens = testkit::AdminApi::using(client.clone(), base, ADMIN_TOKEN)
        .tokens_for(&ids, 86_400)
        .await
        .expect("mint tokens");
    ids.into_iter().zip(tokens).collect()
}

/// Sends a purchase to `url` (the real route or a lab route) as the
/// token's user; every answer must be JSON.
pub async fn send_purchase(client: &reqwest::Client, url: &str, token: &str) -> Answer {
    let started = std::time::Instant::now();
    let response = client
        .post(url)
        .bearer_auth(token)
        .send()
        .await
        .expect("the purchase request completes");
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().expect("a plain Retry-After").to_owned());
    let body = response.json().await.expect("every answer is JSON");
    Answer {
        status,
        retry_after,
        body,
        took: started.elapsed(),
    }
}

/// Sends a purchase to `url` (the real route or a lab route) and returns
/// the status and the error code (or `"ok"` with the order id).
pub async fn post_purchase(
    client: &reqwest::Client,
    url: &str,
    token: &str,
) -> (StatusCode, String) {
    let Answer { status, body, .. } = send_purchase(client, url, token).await;
    match body["order_id"].as_str() {
        Some(id) if status == StatusCode::OK => (status, format!("ok:{id}")),
        _ => (
            status,
            body["error"]
                .as_str()
                .unwrap_or("<no error code>")
                .to_owned(),
        ),
    }
}

/// The service's binary run as a process of its own (killed with the
/// test) on Postgres at `db_url` and Redis at `redis_url` under `prefix`,
/// with `extra` flags; ready when this returns.
pub async fn start_process(
    db_url: &str,
    redis_url: &str,
    prefix: &str,
    extra: &[&str],
) -> ServiceProcess {
    let mut command = Command::new(env!("CARGO_BIN_EXE_seckill"));
    command
        .args(setting_args(db_url, redis_url, prefix))
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null());
    ServiceProcess::start(command, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// Reads with `read` every `pause` until `done` holds of what it read, for
/// `bound` at most (the test fails with `what` and the last reading
/// otherwise); returns that reading.
pub async fn poll_until<T: std::fmt::Debug, F: std::future::Future<Output = T>>(
    bound: Duration,
    pause: Duration,
    what: &str,
    mut read: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    let started = std::time::Instant::now();
    loop {
        let last = read().await;
        if done(&last) {
            return last;
        }
        assert!(
            started.elapsed() < bound,
            "{what} after {bound:?}: {last:?}"
        );
        tokio::time::sleep(pause).await;
    }
}

/// Blocks until `done` says so, asking every `pause`, for `bound` at most:
/// the test fails with `what` otherwise. For the start of servers, before
/// any runtime.
#[track_caller]
pub fn wait_until(bound: Duration, pause: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !done() {
        assert!(started.elapsed() < bound, "{what}");
        std::thread::sleep(pause);
    }
}

/// `127.0.0.1:<port>` for each port, joined by commas: the hosts of a
/// `redis+sentinel://` or `redis+cluster://` URL.
pub fn loopback_hosts(ports: impl IntoIterator<Item = u16>) -> String {
    let hosts: Vec<String> = ports
        .into_iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    hosts.join(",")
}

/// A free loopback port (tests may panic when there is none).
pub fn free_port() -> u16 {
    testkit::free_port().expect("a free loopback port")
}

/// The payment provider's signature of a notification body.
pub fn signature(body: &str) -> String {
    seckill::http::signature_header(PAYMENT_SECRET.as_bytes(), body.as_bytes())
}

/// Delivers a signed payment notification to `base`.
pub async fn notify(
    client: &reqwest::Client,
    base: &str,
    payment_id: &str,
    order_id: &str,
    amount: i64,
) -> (StatusCode, Value) {
    let body = json!({ "payment_id": payment_id, "order_id": order_id, "amount_cents": amount })
        .to_string();
    let notice = client
        .post(format!("{base}/payments/notify"))
        .header("content-type", "application/json")
        .header("x-signature", signature(&body))
        .body(body);
    answer(notice).await
}
