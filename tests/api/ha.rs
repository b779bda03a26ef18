//! Postgres failover under a sale: a three-node Patroni cluster in
//! synchronous mode behind haproxy (`scripts/ha.sh`), the service on
//! haproxy's address. The primary is killed with `kill -9`, or switched
//! over as planned, while many distinct buyers buy: every purchase answered
//! 200 is in the new leader's database, the invariants hold, the sale
//! resumes by itself, and the failover costs answers 503, never a 500.
//! With every standby stopped instead, the primary sells on alone, every
//! purchase answered 200; its Postgres killed then, nobody is promoted: its
//! own Patroni restarts it in place, purchases answered 503 meanwhile, then
//! 200 from the same node, every answered order still there.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use seckill::token::TokenSigner;
use sqlx::{Connection, PgConnection, PgPool};
use testkit::ha::Cluster;
use tokio::sync::MutexGuard;
use tokio::task::JoinSet;

use crate::helpers::{pg_server, send_purchase, spawn_app_with, TestApp, TOKEN_SECRET};

/// One cluster at a time: two clusters on two cores (beside the rest of
/// the suite) slow each other's failovers past any useful bound.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Concurrent buyers, each buying as a new user again and again.
const BUYERS: usize = 16;
/// How long the sale runs on a healthy cluster before the disruption, and
/// how many orders it commits there at least (a slow machine takes longer).
const BEFORE: Duration = Duration::from_millis(1_500);
const ORDERS_BEFORE: usize = 50;
/// How long it goes on once the first order after the disruption was
/// committed.
const AFTER: Duration = Duration::from_secs(1);
/// Bound on the wait for the sale to resume after the disruption.
const RESUME_BOUND: Duration = Duration::from_secs(40);

/// What the tests do with their cluster (`testkit::ha`): a command that
/// must succeed, and a pool on the primary.
trait Drive {
    async fn run_ok(&self, command: &'static str);
    async fn primary(&self, database: &str) -> (PgPool, i32);
    async fn alone(&self) -> bool;
}

impl Drive for Arc<Cluster> {
    /// `scripts/ha.sh <command>` on a blocking thread; fails the test
    /// unless it succeeded.
    async fn run_ok(&self, command: &'static str) {
        let cluster = self.clone();
        let done = tokio::task::spawn_blocking(move || cluster.run(command))
            .await
            .unwrap();
        if let Err(failed) = done {
            panic!("{failed:#}\n{}", self.status());
        }
    }

    /// `Cluster::leads_alone`, on a blocking thread.
    async fn alone(&self) -> bool {
        let cluster = self.clone();
        tokio::task::spawn_blocking(move || cluster.leads_alone())
            .await
            .unwrap()
    }

    /// A pool on `database` through haproxy, once haproxy leads to a
    /// primary (bounded: the failover may still be under way).
    async fn primary(&self, database: &str) -> (PgPool, i32) {
        let url = format!("{}/{database}", self.server);
        let started = Instant::now();
        loop {
            if let Ok(pool) = PgPool::connect(&url).await {
                let answer: Result<(bool, i32), _> =
                    sqlx::query_as("SELECT pg_is_in_recovery(), inet_server_port()")
                        .fetch_one(&pool)
                        .await;
                if let Ok((false, port)) = answer {
                    return (pool, port);
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "haproxy led to no primary within 30 s:\n{}",
                self.status()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// An app whose Postgres is the cluster, reached through haproxy.
///
/// `spawn_app_with` opens the test's own pool on the shared server under
/// the fresh database's name; an empty database of that name there lets
/// it, and its `Drop` removes it. The pool is then pointed at the cluster,
/// so the checks (`check_invariants`) read what the service wrote.
async fn spawn_app_on(cluster: &Arc<Cluster>) -> TestApp {
    let server = cluster.server.clone();
    let mut app = spawn_app_with(move |mut s| {
        let database = s.database_url.rsplit('/').next().unwrap().to_owned();
        create_database_on_shared_server(&database);
        s.database_url = format!("{server}/{database}");
        // A purchase that cannot reach Postgres answers 503 within 2 s.
        s.dependency_timeout = Duration::from_secs(2);
        s
    })
    .await;
    app.db = cluster.primary(&app.db_name).await.0;
    app
}

/// A fresh cluster, once no other test holds one, and an app on it.
async fn cluster_and_app() -> (MutexGuard<'static, ()>, Arc<Cluster>, TestApp) {
    let one = ONE_CLUSTER.lock().await;
    let cluster = tokio::task::spawn_blocking(Cluster::up).await.unwrap();
    let cluster = Arc::new(cluster.expect("a Patroni cluster comes up"));
    let app = spawn_app_on(&cluster).await;
    (one, cluster, app)
}

/// `CREATE DATABASE` on the tests' shared server, from a synchronous
/// closure: on a runtime of its own, on a thread of its own.
fn create_database_on_shared_server(name: &str) {
    let sql = format!("CREATE DATABASE \"{name}\"");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let url = format!("{}/postgres", pg_server());
            let mut conn = PgConnection::connect(&url)
                .await
                .expect("the shared server");
            sqlx::query(&sql).execute(&mut conn).await.unwrap();
        });
    })
    .join()
    .unwrap();
}

/// How one purchase went.
struct Purchase {
    user: i64,
    status: StatusCode,
    order_id: Option<String>,
    sent: Instant,
    answered: Instant,
    error: String,
}

/// The sale: `BUYERS` buyers, each a new user at every purchase, until
/// `stop`; `taken` is the answer of a purchase that took a unit (200, or
/// 202 in an async sale). A buyer answered 503 waits 100 ms, as one honouring
/// `Retry-After` would (sooner, to see the sale resume).
struct Sale {
    stop: Arc<AtomicBool>,
    buyers: JoinSet<Vec<Purchase>>,
    /// When the disruption ended, once it did.
    disruption_ended: Arc<OnceLock<Instant>>,
    /// Set by the first order committed for a purchase sent after that.
    resumed: Arc<AtomicBool>,
    /// Purchases answered `taken` so far.
    committed: Arc<AtomicUsize>,
}

/// Waits (30 s at most) until the sale has run for `BEFORE` and `counter`
/// has reached `ORDERS_BEFORE`: what every test here does before it
/// disrupts the cluster.
async fn warm_up(counter: &AtomicUsize, what: &str) {
    let started = Instant::now();
    while started.elapsed() < BEFORE || counter.load(Ordering::Relaxed) < ORDERS_BEFORE {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what} {} orders in 30 s before any disruption",
            counter.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Sale {
    fn start(app: &TestApp, voucher: i64, taken: StatusCode) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let next_user = Arc::new(AtomicI64::new(1));
        let disruption_ended = Arc::new(OnceLock::new());
        let resumed = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicUsize::new(0));
        let signer = TokenSigner::new(TOKEN_SECRET.as_bytes());
        let expires = chrono::Utc::now().timestamp() + 3_600;
        let url = app.url(&format!("/seckill/{voucher}"));
        let mut buyers = JoinSet::new();
        for _ in 0..BUYERS {
            let (stop, next_user) = (stop.clone(), next_user.clone());
            let (ended, resumed) = (disruption_ended.clone(), resumed.clone());
            let committed = committed.clone();
            let (signer, url, client) = (signer.clone(), url.clone(), app.client.clone());
            buyers.spawn(async move {
                let mut purchases = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let user = next_user.fetch_add(1, Ordering::Relaxed);
                    let token = signer.sign(user, expires);
                    let sent = Instant::now();
                    let answer = send_purchase(&client, &url, &token).await;
                    let purchase = Purchase {
                        user,
                        status: answer.status,
                        order_id: answer.body["order_id"].as_str().map(str::to_owned),
                        sent,
                        answered: Instant::now(),
                        error: answer.body["error"].as_str().unwrap_or("").to_owned(),
                    };
                    let unavailable = purchase.status == StatusCode::SERVICE_UNAVAILABLE;
                    if purchase.status == taken {
                        committed.fetch_add(1, Ordering::Relaxed);
                        if ended.get().is_some_and(|ended| sent >= *ended) {
                            resumed.store(true, Ordering::Relaxed);
                        }
                    }
                    purchases.push(purchase);
                    if unavailable {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                purchases
            });
        }
        Self {
            stop,
            buyers,
            disruption_ended,
            resumed,
            committed,
        }
    }

    /// A sync sale started and warmed up (`warm_up`): ready to be disrupted.
    async fn warmed_up(app: &TestApp, voucher: i64) -> Self {
        let sale = Self::start(app, voucher, StatusCode::OK);
        warm_up(&sale.committed, "the sale committed").await;
        sale
    }

    /// Runs `scripts/ha.sh <disruption>` on `cluster` under the sale; when
    /// it began and when it ended.
    async fn disrupt(
        &self,
        cluster: &Arc<Cluster>,
        disruption: &'static str,
    ) -> (Instant, Instant) {
        let began = Instant::now();
        cluster.run_ok(disruption).await;
        let ended = Instant::now();
        self.disruption_ended.set(ended).unwrap();
        (began, ended)
    }

    /// Waits until an order is committed for a purchase sent after the
    /// disruption, which began at `began`: within `RESUME_BOUND`.
    async fn resumed(&self, began: Instant, what: &str, cluster: &Cluster) {
        while !self.resumed.load(Ordering::Relaxed) {
            assert!(
                began.elapsed() < RESUME_BOUND,
                "no order committed within {RESUME_BOUND:?} of {what}:\n{}",
                cluster.status()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn finish(self) -> Vec<Purchase> {
        self.stop.store(true, Ordering::Relaxed);
        self.buyers.join_all().await.into_iter().flatten().collect()
    }
}

/// Fails the test unless every purchase was answered with one of
/// `allowed`; the message lists the others.
#[track_caller]
fn assert_answered_only(purchases: &[Purchase], allowed: &[StatusCode]) {
    let unexpected: Vec<String> = purchases
        .iter()
        .filter(|p| !allowed.contains(&p.status))
        .map(|p| format!("user {}: {} {}", p.user, p.status, p.error))
        .collect();
    assert!(
        unexpected.is_empty(),
        "answers other than {allowed:?}: {unexpected:?}"
    );
}

/// The voucher's stored orders, as (order id, user id), read from `db`.
async fn stored_orders<'e>(
    db: impl sqlx::PgExecutor<'e>,
    voucher: i64,
) -> sqlx::Result<Vec<(i64, i64)>> {
    sqlx::query_as("SELECT id, user_id FROM voucher_orders WHERE voucher_id = $1")
        .bind(voucher)
        .fetch_all(db)
        .await
}

/// The ids of `stored` orders as the API answers them.
fn order_ids(stored: &[(i64, i64)]) -> HashSet<String> {
    stored.iter().map(|(id, _)| id.to_string()).collect()
}

/// The ids of the orders answered `status` (200, or 202 in an async sale).
fn answered_ids(purchases: &[Purchase], status: StatusCode) -> HashSet<String> {
    purchases
        .iter()
        .filter(|p| p.status == status)
        .map(|p| {
            let id = p.order_id.clone();
            id.unwrap_or_else(|| panic!("a {} carries its order id", status.as_u16()))
        })
        .collect()
}

/// The longest stretch between two answers among `purchases` (zero with
/// fewer than two).
fn longest_gap<'a>(purchases: impl IntoIterator<Item = &'a Purchase>) -> Duration {
    let mut answers: Vec<Instant> = purchases.into_iter().map(|p| p.answered).collect();
    answers.sort();
    answers
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

/// What a disruption cost, as the buyers saw it.
struct Report {
    purchases: usize,
    ok: usize,
    unavailable: usize,
    /// From the disruption's start to the first order committed for a
    /// purchase sent after it ended.
    resumed: Duration,
    /// The longest stretch with no purchase answered 200.
    longest_gap: Duration,
    /// Answered 200 and not in the database: must be 0.
    missing: usize,
    /// In the database though answered 503 (the commit's answer was lost
    /// with the connection): allowed, the buyer holds the order.
    stored_unanswered: usize,
}

/// Runs a sale on a fresh cluster, disrupts it with `scripts/ha.sh
/// <disruption>` after `BEFORE` and `ORDERS_BEFORE`, lets it go on until
/// an order is committed after the disruption (and `AFTER` more), then
/// checks what was answered against what the new leader holds.
async fn sale_through(disruption: &'static str) -> Report {
    let (_one, cluster, mut app) = cluster_and_app().await;
    let (_, leader_before) = cluster.primary("postgres").await;
    let voucher = app.open_voucher(1_000_000).await;

    let sale = Sale::warmed_up(&app, voucher).await;
    let (disrupted, disruption_ended) = sale.disrupt(&cluster, disruption).await;

    // Sell on until a purchase sent after the disruption is answered 200.
    let what = format!("`{disruption}`");
    sale.resumed(disrupted, &what, &cluster).await;
    tokio::time::sleep(AFTER).await;
    let purchases = sale.finish().await;

    // Read what the new leader holds, through haproxy.
    let (pool, leader_after) = cluster.primary(&app.db_name).await;
    assert_ne!(
        leader_before,
        leader_after,
        "`{disruption}` left the same node leading:\n{}",
        cluster.status()
    );
    let stored = stored_orders(&pool, voucher).await.unwrap();
    let stored_ids = order_ids(&stored);
    let stored_users: HashSet<i64> = stored.iter().map(|&(_, user)| user).collect();
    // The outbox through the failover: one order.created per stored
    // order, and none for an order that is not stored (the event is
    // written in the order's own transaction).
    let mut created: Vec<i64> = sqlx::query_scalar(
        "SELECT order_id FROM order_events WHERE type = 'order.created' AND voucher_id = $1",
    )
    .bind(voucher)
    .fetch_all(&pool)
    .await
    .unwrap();
    created.sort_unstable();
    let mut stored_order_ids: Vec<i64> = stored.iter().map(|&(id, _)| id).collect();
    stored_order_ids.sort_unstable();
    assert_eq!(
        created, stored_order_ids,
        "`{disruption}`: the order.created events are not the stored orders, each once"
    );

    assert_answered_only(
        &purchases,
        &[StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE],
    );
    let answered_ok: Vec<&Purchase> = purchases
        .iter()
        .filter(|p| p.status == StatusCode::OK)
        .collect();
    let missing: Vec<String> = answered_ok
        .iter()
        .map(|p| p.order_id.clone().expect("a 200 carries its order id"))
        .filter(|id| !stored_ids.contains(id))
        .collect();
    let stored_unanswered = purchases
        .iter()
        .filter(|p| p.status == StatusCode::SERVICE_UNAVAILABLE && stored_users.contains(&p.user))
        .count();
    assert!(
        answered_ok.iter().any(|p| p.answered < disrupted),
        "no order committed before `{disruption}`"
    );
    let resumed = answered_ok
        .iter()
        .filter(|p| p.sent >= disruption_ended)
        .map(|p| p.answered - disrupted)
        .min()
        .expect("the buyers bought again after the disruption");
    let longest_gap = longest_gap(answered_ok.iter().copied());

    // Every order answered is there, and the sale's books balance.
    assert!(
        missing.is_empty(),
        "{} orders answered 200 are not in the new leader's database: {missing:?}",
        missing.len()
    );
    app.db = pool;
    app.check_invariants(voucher).await;
    Report {
        purchases: purchases.len(),
        ok: answered_ok.len(),
        unavailable: purchases.len() - answered_ok.len(),
        resumed,
        longest_gap,
        missing: missing.len(),
        stored_unanswered,
    }
}

fn print(what: &str, r: &Report) {
    eprintln!(
        "{what}: {} purchases, {} answered 200, {} answered 503; first order committed {:?} \
         after it began, longest stretch without a committed order {:?}; answered 200 and \
         missing: {}; stored though answered 503: {}",
        r.purchases, r.ok, r.unavailable, r.resumed, r.longest_gap, r.missing, r.stored_unanswered
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_mid_sale_loses_no_answered_order_needs_patroni() {
    let report = sale_through("kill-primary").await;
    print("kill -9 of the primary", &report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_mid_sale_loses_no_answered_order_needs_patroni() {
    let report = sale_through("switchover").await;
    print("planned switchover", &report);
}

/// The primary killed with `kill -9` while an async sale's stream writers
/// are writing: Redis goes on accepting (202, never 503), the writers retry against
/// the new leader, and every order accepted is stored there once they
/// caught up; the invariants hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_under_async_writers_loses_no_accepted_order_needs_patroni() {
    let (_one, cluster, mut app) = cluster_and_app().await;
    let voucher = app.open_async_voucher(1_000_000).await;

    let sale = Sale::start(&app, voucher, StatusCode::ACCEPTED);
    warm_up(&sale.committed, "the async sale accepted").await;
    cluster.run_ok("kill-primary").await;
    // Accepting on through the failover, long enough for a new leader.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let purchases = sale.finish().await;

    assert_answered_only(
        &purchases,
        &[StatusCode::ACCEPTED, StatusCode::SERVICE_UNAVAILABLE],
    );
    // Redis sells an async sale: a failover of Postgres holds back its
    // writers, not its buyers.
    let unavailable = purchases
        .iter()
        .filter(|p| p.status == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert_eq!(
        unavailable, 0,
        "async purchases answered 503 in the failover"
    );
    let accepted_ids = answered_ids(&purchases, StatusCode::ACCEPTED);

    // The writers store every accepted order on the new leader (bounded).
    let waited = Instant::now();
    let missing = loop {
        let (pool, _) = cluster.primary(&app.db_name).await;
        let stored = order_ids(&stored_orders(&pool, voucher).await.unwrap_or_default());
        let missing: Vec<&String> = accepted_ids.difference(&stored).collect();
        if missing.is_empty() || waited.elapsed() > Duration::from_secs(60) {
            app.db = pool;
            break missing.len();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        missing,
        0,
        "orders accepted 202 not stored 60 s after the sale:\n{}",
        cluster.status()
    );
    app.check_invariants(voucher).await;
    eprintln!(
        "kill -9 under async writers: {} purchases, {} accepted, every one stored {:?} after the sale",
        purchases.len(),
        accepted_ids.len(),
        waited.elapsed()
    );
}

/// The primary killed with `kill -9` while unpaid orders pass their
/// deadline (2 s) and their units come back and sell again: once the sale
/// stopped and every order expired, every unit came back exactly once
/// (stock = initial, no live order), and every order answered 200 is
/// stored on the new leader, expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_while_orders_expire_returns_every_unit_once_needs_patroni() {
    const STOCK: i64 = 300;
    let (_one, cluster, mut app) = cluster_and_app().await;
    let voucher = app
        .open_voucher_with(STOCK, serde_json::json!({ "pay_within_seconds": 2 }))
        .await;

    let sale = Sale::start(&app, voucher, StatusCode::OK);
    let started = Instant::now();
    // Past the first deadlines, so that expiries run when the kill lands.
    while started.elapsed() < Duration::from_secs(3)
        || sale.committed.load(Ordering::Relaxed) < ORDERS_BEFORE
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the sale committed {} orders in 30 s",
            sale.committed.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (killed, _) = sale.disrupt(&cluster, "kill-primary").await;
    sale.resumed(killed, "the kill", &cluster).await;
    // Units that expired around the kill come back and sell again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let purchases = sale.finish().await;

    let allowed = [
        StatusCode::OK,
        StatusCode::SERVICE_UNAVAILABLE,
        StatusCode::CONFLICT,
    ];
    assert_answered_only(&purchases, &allowed);
    let answered = answered_ids(&purchases, StatusCode::OK);

    // Every order expires within its 2 s and the sweeper's pass (bounded).
    let waited = Instant::now();
    let (pool, stored, live, stock) = loop {
        let (pool, _) = cluster.primary(&app.db_name).await;
        let read: Result<(Vec<(i64, String)>, i32), sqlx::Error> = async {
            let orders =
                sqlx::query_as("SELECT id, status::text FROM voucher_orders WHERE voucher_id = $1")
                    .bind(voucher)
                    .fetch_all(&pool)
                    .await?;
            let (stock,): (i32,) =
                sqlx::query_as("SELECT stock FROM seckill_vouchers WHERE voucher_id = $1")
                    .bind(voucher)
                    .fetch_one(&pool)
                    .await?;
            Ok((orders, stock))
        }
        .await;
        if let Ok((orders, stock)) = read {
            let live = orders
                .iter()
                .filter(|(_, status)| status == "unpaid" || status == "paid")
                .count();
            if live == 0 || waited.elapsed() > Duration::from_secs(60) {
                break (pool, orders, live, stock);
            }
        }
        assert!(
            waited.elapsed() < Duration::from_secs(90),
            "the orders could not be read:\n{}",
            cluster.status()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(live, 0, "unpaid orders left 60 s after the sale");
    let stored_ids: HashSet<String> = stored.iter().map(|(id, _)| id.to_string()).collect();
    let missing: Vec<&String> = answered.difference(&stored_ids).collect();
    assert!(
        missing.is_empty(),
        "{} orders answered 200 are not in the new leader's database",
        missing.len()
    );
    assert!(
        stored.iter().all(|(_, status)| status == "expired"),
        "an order neither live nor expired"
    );
    // Each expired order gave its unit back once: all of them are back.
    assert_eq!(
        i64::from(stock),
        STOCK,
        "stock after {} expiries",
        stored.len()
    );
    app.db = pool;
    app.check_invariants(voucher).await;
    eprintln!(
        "kill -9 while orders expire: {} purchases, {} answered 200, {} orders expired, stock back to {stock}",
        purchases.len(),
        answered.len(),
        stored.len()
    );
}

/// The old primary coming back while the sale goes on: after a `kill -9`
/// its Patroni (still running) starts it again, rewound, as a replica of
/// the new leader. Once it streams, it holds every order answered 200,
/// the sale never stopped for it, and the invariants hold on the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_rejoins_as_a_replica_while_the_sale_goes_on_needs_patroni() {
    let (_one, cluster, mut app) = cluster_and_app().await;
    let (_, old_port) = cluster.primary("postgres").await;
    let voucher = app.open_voucher(1_000_000).await;

    let sale = Sale::warmed_up(&app, voucher).await;
    let (killed, _) = sale.disrupt(&cluster, "kill-primary").await;

    // The old primary back as a running replica, the sale on meanwhile.
    let host = format!("127.0.0.1:{old_port}");
    let rejoined = loop {
        let status = cluster.status();
        let back = status.lines().any(|l| {
            l.contains(&host)
                && !l.contains("Leader")
                && (l.contains("running") || l.contains("streaming"))
        });
        if back && sale.resumed.load(Ordering::Relaxed) {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(90),
            "the old primary did not rejoin within 90 s of the kill:\n{status}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let committed_at_rejoin = sale.committed.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        sale.committed.load(Ordering::Relaxed) > committed_at_rejoin,
        "no order committed in the 2 s after the old primary rejoined:\n{}",
        cluster.status()
    );
    let purchases = sale.finish().await;
    let answered = answered_ids(&purchases, StatusCode::OK);
    assert_answered_only(
        &purchases,
        &[StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE],
    );

    // The rejoined node, read directly, catches up with every answered
    // order (bounded): it was rewound onto the new leader's history.
    let direct = format!("postgres://postgres@{host}/{}", app.db_name);
    let caught_up = Instant::now();
    loop {
        let stored = match PgConnection::connect(&direct).await {
            Ok(mut conn) => order_ids(&stored_orders(&mut conn, voucher).await.unwrap_or_default()),
            Err(_) => HashSet::new(),
        };
        let missing = answered.difference(&stored).count();
        if missing == 0 {
            break;
        }
        assert!(
            caught_up.elapsed() < Duration::from_secs(30),
            "the rejoined node lacks {missing} orders answered 200 after 30 s:\n{}",
            cluster.status()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (pool, _) = cluster.primary(&app.db_name).await;
    app.db = pool;
    app.check_invariants(voucher).await;
    eprintln!(
        "old primary rejoined {rejoined:?} after the kill; {} purchases, {} answered 200, \
         all on the rejoined node",
        purchases.len(),
        answered.len()
    );
}

/// A pool on the app's database at the primary, which must still be the
/// node that led before (`leader_before`, its port); `changed` says what
/// it means if another node leads.
async fn still_leading(
    cluster: &Arc<Cluster>,
    app: &TestApp,
    leader_before: i32,
    changed: &str,
) -> PgPool {
    let (pool, leader_after) = cluster.primary(&app.db_name).await;
    assert_eq!(
        leader_before,
        leader_after,
        "{changed}:\n{}",
        cluster.status()
    );
    pool
}

/// Waits until Patroni reports the leader alone (`Cluster::leads_alone`)
/// and the primary's own Postgres waits for no standby and streams to
/// none, within 60 s of `stopped` (when `stop-replicas` began): when it
/// first saw both.
async fn alone_since(cluster: &Arc<Cluster>, stopped: Instant) -> Instant {
    loop {
        let patroni_alone = cluster.alone().await;
        let (pool, _) = cluster.primary("postgres").await;
        let postgres: Result<(String, i64), _> = sqlx::query_as(
            "SELECT current_setting('synchronous_standby_names'), \
             (SELECT count(*) FROM pg_stat_replication)",
        )
        .fetch_one(&pool)
        .await;
        pool.close().await;
        if patroni_alone
            && postgres
                .as_ref()
                .is_ok_and(|(names, n)| names.is_empty() && *n == 0)
        {
            return Instant::now();
        }
        // Patroni needs a few HA loops (ttl 10 s): 60 s leaves room for a
        // machine busy with a build beside the test.
        assert!(
            stopped.elapsed() < Duration::from_secs(60),
            "the primary is not alone 60 s after the standbys were stopped ({postgres:?}):\n{}\n{}",
            cluster.status(),
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every standby stopped under a sale (`scripts/ha.sh stop-replicas`, with
/// `synchronous_mode_strict` false): the leader goes on alone. Patroni
/// reports it alone, with no synchronous standby, and its Postgres waits
/// for none (`synchronous_standby_names` empty) and streams to nobody;
/// every purchase is answered 200, before, while and after the standbys
/// go, by the same primary, and every order answered is in its database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_standby_stopped_leaves_a_lone_primary_that_answers_200_needs_patroni() {
    let (_one, cluster, mut app) = cluster_and_app().await;
    let (_, leader_before) = cluster.primary("postgres").await;
    let voucher = app.open_voucher(1_000_000).await;

    let sale = Sale::warmed_up(&app, voucher).await;
    let (stopped, script_done) = sale.disrupt(&cluster, "stop-replicas").await;

    let alone = alone_since(&cluster, stopped).await;
    // Selling on alone.
    tokio::time::sleep(AFTER).await;
    let purchases = sale.finish().await;

    // Every purchase answered 200: the standbys' going cost the buyers
    // nothing.
    assert_answered_only(&purchases, &[StatusCode::OK]);
    let sold_alone = purchases.iter().filter(|p| p.sent >= alone).count();
    assert!(
        sold_alone > 0,
        "no purchase was sent once the primary was alone"
    );

    // The same node leads, alone still, and holds every order answered.
    let pool = still_leading(&cluster, &app, leader_before, "the leader changed").await;
    let (streaming,): (i64,) = sqlx::query_as("SELECT count(*) FROM pg_stat_replication")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(streaming, 0, "the primary streams to a standby again");
    let stored = order_ids(&stored_orders(&pool, voucher).await.unwrap());
    let answered = answered_ids(&purchases, StatusCode::OK);
    let missing = answered.difference(&stored).count();
    assert_eq!(
        missing, 0,
        "orders answered 200 not in the lone primary's database"
    );
    app.db = pool;
    app.check_invariants(voucher).await;

    let longest_gap = longest_gap(&purchases);
    eprintln!(
        "every standby stopped: the script took {:?}, Patroni and Postgres reported the primary \
         alone {:?} after it began; {} purchases, all answered 200 ({sold_alone} sent once alone), \
         all stored; longest stretch without an answer {longest_gap:?}",
        script_done - stopped,
        alone - stopped,
        purchases.len()
    );
}

/// The Postgres timeline of the primary behind `pool`: each promotion
/// starts a new one.
async fn timeline(pool: &PgPool) -> i64 {
    let (file,): (String,) = sqlx::query_as("SELECT pg_walfile_name(pg_current_wal_lsn())")
        .fetch_one(pool)
        .await
        .unwrap();
    i64::from_str_radix(&file[..8], 16).unwrap()
}

/// The lone primary's Postgres killed (`kill -9`) under a sale, once every
/// standby was stopped and it had sold alone. With no synchronous standby
/// nobody may be promoted, so Patroni, still running on that node and
/// still holding the leader key, restarts its Postgres in place (crash
/// recovery, started read-only, promoted again by itself: one new
/// timeline). Meanwhile purchases are answered 503, never anything but 200
/// or 503, and Patroni, polled all along, lists no other member leading or
/// running; then the same node answers 200 again and holds every order
/// answered 200, before the kill and after it; the invariants hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_primary_killed_answers_503_until_its_patroni_restarts_it_in_place_needs_patroni() {
    let (_one, cluster, mut app) = cluster_and_app().await;
    let (_, leader_before) = cluster.primary("postgres").await;
    let voucher = app.open_voucher(1_000_000).await;

    let sale = Sale::warmed_up(&app, voucher).await;
    let stopped = Instant::now();
    cluster.run_ok("stop-replicas").await;
    let alone = alone_since(&cluster, stopped).await;

    // Selling alone: some orders committed once nothing streams.
    let committed_alone = sale.committed.load(Ordering::Relaxed);
    while alone.elapsed() < Duration::from_millis(500)
        || sale.committed.load(Ordering::Relaxed) < committed_alone + 20
    {
        assert!(
            alone.elapsed() < Duration::from_secs(15),
            "the lone primary committed {} orders in 15 s",
            sale.committed.load(Ordering::Relaxed) - committed_alone
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (pool, _) = cluster.primary("postgres").await;
    let timeline_before = timeline(&pool).await;
    pool.close().await;

    let (killed, kill_sent) = sale.disrupt(&cluster, "kill-primary").await;
    // Until an order is committed for a purchase sent after the kill,
    // Patroni lists no other member leading or running.
    let leader_host = format!("127.0.0.1:{leader_before}");
    while !sale.resumed.load(Ordering::Relaxed) {
        let patroni = cluster.clone();
        let status = tokio::task::spawn_blocking(move || patroni.status())
            .await
            .unwrap();
        let members: Vec<&str> = status
            .lines()
            .filter(|l| l.contains("127.0.0.1:"))
            .collect();
        if !members.is_empty() {
            let elsewhere = members.iter().any(|l| {
                !l.contains(&leader_host)
                    && (l.contains("Leader") || l.contains("running") || l.contains("streaming"))
            });
            assert!(
                !elsewhere,
                "another member leads or runs after the kill:\n{status}"
            );
        }
        assert!(
            killed.elapsed() < RESUME_BOUND,
            "no order committed within {RESUME_BOUND:?} of the kill of the lone primary:\n{status}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(AFTER).await;
    let purchases = sale.finish().await;

    assert_answered_only(
        &purchases,
        &[StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE],
    );
    let ok = |p: &&Purchase| p.status == StatusCode::OK;
    let unavailable = |p: &&Purchase| p.status == StatusCode::SERVICE_UNAVAILABLE;
    // Alone and alive, the primary answered every purchase 200.
    let before_kill: Vec<&Purchase> = purchases.iter().filter(|p| p.answered < killed).collect();
    assert!(
        before_kill.iter().all(ok),
        "a purchase answered before the kill was not answered 200"
    );
    let sold_alone = before_kill.iter().filter(|p| p.sent >= alone).count();
    assert!(
        sold_alone > 0,
        "no purchase was sent once the primary was alone"
    );
    // The outage: from the kill to the first 200 for a purchase sent after
    // it; the buyers heard 503 then.
    let returned = purchases
        .iter()
        .filter(|p| p.status == StatusCode::OK && p.sent >= kill_sent)
        .map(|p| p.answered)
        .min()
        .expect("a purchase sent after the kill was answered 200");
    let in_outage = |p: &&Purchase| p.answered >= kill_sent && p.answered < returned;
    let refused = purchases
        .iter()
        .filter(in_outage)
        .filter(unavailable)
        .count();
    let answered_ok_in_outage = purchases.iter().filter(in_outage).filter(ok).count();
    assert!(refused > 0, "no purchase was answered 503 after the kill");
    let sold_after = purchases
        .iter()
        .filter(|p| p.status == StatusCode::OK && p.answered > returned)
        .count();
    assert!(
        sold_after > 0,
        "no other purchase answered 200 once the primary returned"
    );

    // The same node leads, alone, promoted once more by itself.
    let pool = still_leading(
        &cluster,
        &app,
        leader_before,
        "another node leads after the kill",
    )
    .await;
    assert!(
        cluster.alone().await,
        "the restarted primary is not alone:\n{}",
        cluster.status()
    );
    let timeline_after = timeline(&pool).await;
    assert_eq!(
        timeline_after,
        timeline_before + 1,
        "the restarted primary's timeline: one promotion, its own"
    );

    // Every order answered 200, before the kill and after, is on it.
    let stored = stored_orders(&pool, voucher).await.unwrap();
    let stored_ids = order_ids(&stored);
    let stored_users: HashSet<i64> = stored.iter().map(|&(_, user)| user).collect();
    let answered = answered_ids(&purchases, StatusCode::OK);
    let missing = answered.difference(&stored_ids).count();
    assert_eq!(
        missing, 0,
        "orders answered 200 not in the restarted primary's database"
    );
    let stored_unanswered = purchases
        .iter()
        .filter(unavailable)
        .filter(|p| stored_users.contains(&p.user))
        .count();
    app.db = pool;
    app.check_invariants(voucher).await;
    eprintln!(
        "the lone primary killed: {} purchases; {sold_alone} sent once it was alone, {} answered 200 \
         before the kill, all stored; answered 503 from the kill until the first order committed \
         {:?} after it ({refused} answered 503, {answered_ok_in_outage} answered 200 in that time \
         for purchases sent before it, {sold_after} after it); {} answered 200 in all, all stored on the same node \
         (timeline {timeline_before} -> {timeline_after}); stored though answered 503: \
         {stored_unanswered}",
        purchases.len(),
        before_kill.len(),
        returned - killed,
        answered.len()
    );
}
