//! Redis Cluster (`REDIS_URL=redis+cluster://...`): the service's keys
//! spread over several masters, each command routed to its slot's master;
//! the lock's pub/sub and its watchdog work across nodes; a master killed
//! mid-crowd is replaced by its replica and sales resume by themselves.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis_locks::{Acquired, Endpoint, LockClient, LockOptions};
use reqwest::StatusCode;

use crate::helpers::{
    buy, crowd, loopback_hosts, send_purchase, spawn_app_on_redis, wait_until, OwnRedis,
};

/// A private Redis Cluster: `masters` masters, each with `replicas`
/// replicas, on free loopback ports.
struct Cluster {
    nodes: Vec<OwnRedis>,
}

impl Cluster {
    fn start(masters: usize, replicas: usize) -> Self {
        let nodes: Vec<OwnRedis> = (0..masters * (1 + replicas))
            .map(|_| {
                OwnRedis::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                ])
            })
            .collect();
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = Self { nodes };
        let (bound, pause) = (Duration::from_secs(30), Duration::from_millis(100));
        wait_until(bound, pause, "the cluster did not come up", || {
            cluster.settled()
        });
        cluster
    }

    /// Every node says the cluster is ok and every replica is in sync.
    fn settled(&self) -> bool {
        self.nodes.iter().all(|node| {
            let info = cli(node, &["CLUSTER", "INFO"]);
            let replication = cli(node, &["INFO", "replication"]);
            info.contains("cluster_state:ok")
                && (replication.contains("role:master")
                    || replication.contains("master_link_status:up"))
        })
    }

    fn url(&self) -> String {
        let hosts = loopback_hosts(self.nodes.iter().map(|n| n.port));
        format!("redis+cluster://{hosts}")
    }

    fn node_urls(&self) -> Vec<String> {
        self.nodes.iter().map(OwnRedis::url).collect()
    }

    /// The indexes of the nodes that are masters now.
    fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| cli(&self.nodes[i], &["INFO", "replication"]).contains("role:master"))
            .collect()
    }

    /// Keys held by each master (DBSIZE).
    fn keys_per_master(&self) -> Vec<u64> {
        self.masters()
            .into_iter()
            .map(|i| cli(&self.nodes[i], &["DBSIZE"]).trim().parse().unwrap_or(0))
            .collect()
    }
}

fn cli(node: &OwnRedis, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &node.port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn lock_client(cluster: &Cluster, watchdog_lease: Duration) -> LockClient {
    let endpoint = Endpoint::cluster(cluster.node_urls()).expect("node URLs");
    let options = LockOptions {
        watchdog_lease,
        ..LockOptions::default()
    };
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    LockClient::with_options(endpoint, prefix, options)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_on_two_instances_sells_through_a_three_master_cluster_needs_redis_cli() {
    let cluster = Cluster::start(3, 0);
    let url = cluster.url();
    let app = spawn_app_on_redis(url, None).await;
    app.wait_ready().await;
    let second = app.spawn_instance().await;
    let stock = 100;
    let voucher = app.open_voucher(stock).await;
    let tokens = app.tokens(1..=300).await;
    let mut answers: HashMap<(StatusCode, String), usize> = HashMap::new();
    for (_, status, code) in crowd(&[&app.base, &second], &tokens, voucher, 1).await {
        let code = if status == StatusCode::OK {
            "ok".to_owned()
        } else {
            code
        };
        *answers.entry((status, code)).or_default() += 1;
    }
    let sold = answers
        .get(&(StatusCode::OK, "ok".to_owned()))
        .copied()
        .unwrap_or(0);
    for (status, code) in answers.keys() {
        assert!(
            *status == StatusCode::OK || (*status == StatusCode::CONFLICT && code == "sold_out"),
            "unexpected answers: {answers:?}"
        );
    }
    assert_eq!(sold, 100, "{answers:?}");
    assert_eq!(app.check_invariants(voucher).await, 100);
    // The service's keys live on more than one master.
    let spread = cluster.keys_per_master();
    assert!(
        spread.iter().filter(|&&keys| keys > 0).count() >= 2,
        "all keys on one master: {spread:?}"
    );
    let (status, _) = app.admin_get("/readyz").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_renews_locks_on_every_master_of_a_cluster_needs_redis_cli() {
    let cluster = Cluster::start(3, 0);
    let lease = Duration::from_millis(600);
    let locks = lock_client(&cluster, lease);
    let mut guards = Vec::new();
    for i in 0..60 {
        let lock = locks.lock(&format!("job:{i}"));
        match lock
            .try_acquire(&locks.owner(i), redis_locks::Lease::Watchdog)
            .await
            .unwrap()
        {
            Acquired::Yes(guard) => guards.push(guard),
            other => panic!("a free lock was refused: {other:?}"),
        }
    }
    let spread = cluster.keys_per_master();
    assert!(
        spread.iter().all(|&keys| keys > 0),
        "the locks should span every master: {spread:?}"
    );
    // Several leases pass: only renewal keeps them.
    tokio::time::sleep(lease * 4).await;
    for guard in &guards {
        assert!(!guard.is_lost(), "{:?} was lost", guard.lock().key());
        assert!(
            guard.lock().is_held_by(guard.owner()).await.unwrap(),
            "{:?} expired",
            guard.lock().key()
        );
    }
    for guard in guards {
        guard.unlock().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_hears_an_unlock_published_on_another_node_needs_redis_cli() {
    let cluster = Cluster::start(3, 0);
    let locks = lock_client(&cluster, Duration::from_secs(30));
    // A lock whose key lives on a node other than the first one, where the
    // subscriber connects first.
    let first = &cluster.nodes[0];
    let name = (0..)
        .map(|i| format!("order:{i}"))
        .find(|name| cli(first, &["GET", locks.lock(name).key()]).contains("MOVED"))
        .unwrap();
    let lock = locks.lock(&name);
    let lease = Duration::from_secs(20);
    let Acquired::Yes(holder) = lock
        .try_acquire(&locks.owner("holder"), lease)
        .await
        .unwrap()
    else {
        panic!("a free lock was refused")
    };
    let waiter = {
        let (lock, owner) = (lock.clone(), locks.owner("waiter"));
        tokio::spawn(async move { lock.acquire(&owner, lease, lease).await })
    };
    // The waiter subscribes, then the holder lets go.
    let started = Instant::now();
    while locks.waiting_channels() == 0 {
        assert!(started.elapsed() < Duration::from_secs(5), "no waiter");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let released = Instant::now();
    holder.unlock().await.unwrap();
    let got = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter got the lock");
    // Woken by the message, not by the end of the holder's 20 s lease.
    assert!(
        released.elapsed() < lease / 4,
        "woke only after {:?}",
        released.elapsed()
    );
    got.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sales_resume_by_themselves_after_a_master_of_the_cluster_dies_needs_redis_cli() {
    let mut cluster = Cluster::start(3, 1);
    let url = cluster.url();
    let app = spawn_app_on_redis(url, Some(1_000)).await;
    app.wait_ready().await;
    let second = app.spawn_instance().await;
    let voucher = app.open_voucher(5_000).await;
    let tokens = Arc::new(app.tokens(1..=4_000).await);
    let next_user = Arc::new(Mutex::new(1_i64));
    // (time, status, code) of every answer.
    let answers = Arc::new(Mutex::new(Vec::<(Instant, StatusCode, String)>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut crowd = Vec::new();
    for worker in 0..4 {
        let (client, tokens, next_user, answers, stop) = (
            app.client.clone(),
            tokens.clone(),
            next_user.clone(),
            answers.clone(),
            stop.clone(),
        );
        let base = if worker % 2 == 0 {
            app.base.clone()
        } else {
            second.clone()
        };
        crowd.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let user = {
                    let mut next = next_user.lock().unwrap();
                    *next += 1;
                    *next - 1
                };
                let Some(token) = tokens.get(&user) else {
                    return;
                };
                let (status, code) = buy(&client, &base, token, voucher).await;
                answers.lock().unwrap().push((Instant::now(), status, code));
                if status != StatusCode::OK {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
    }
    // Mid-crowd, a master dies.
    let sold_before = || {
        answers
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s, _)| *s == StatusCode::OK)
            .count()
    };
    while sold_before() < 100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let victim = cluster.masters()[0];
    cluster.nodes[victim].stop();
    let died = Instant::now();
    // /readyz says 503 while the cluster cannot serve every slot, then 200.
    let mut readyz_unavailable = false;
    loop {
        assert!(
            died.elapsed() < Duration::from_secs(40),
            "/readyz never said 200 again after the failover"
        );
        let (status, _) = app.admin_get("/readyz").await;
        assert!(
            status == StatusCode::OK || status == StatusCode::SERVICE_UNAVAILABLE,
            "{status}"
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            readyz_unavailable = true;
        } else if readyz_unavailable {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Sales continue for a while on the new master, then the crowd stops.
    let recovered = Instant::now();
    while Instant::now() - recovered < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for worker in crowd {
        worker.await.unwrap();
    }
    let answers = answers.lock().unwrap().clone();
    let mut last_refused = None;
    let mut unavailable = 0;
    for (at, status, code) in &answers {
        assert!(
            *status == StatusCode::OK || *status == StatusCode::SERVICE_UNAVAILABLE,
            "{status} {code}"
        );
        if *status == StatusCode::SERVICE_UNAVAILABLE {
            unavailable += 1;
            last_refused = Some(at.saturating_duration_since(died));
        }
    }
    let sold_after = answers
        .iter()
        .filter(|(at, s, _)| *s == StatusCode::OK && *at > recovered)
        .count();
    assert!(sold_after > 0, "no sale after the failover");
    eprintln!(
        "a master died: last 503 {last_refused:?} after its death, {unavailable} answers 503, \
         {} answers in all, {sold_after} sold in the 2 s after /readyz said 200 again",
        answers.len()
    );
    app.check_invariants(voucher).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_crowd_on_a_cluster_is_accepted_looked_up_and_written_needs_redis_cli() {
    let cluster = Cluster::start(3, 0);
    let app = spawn_app_on_redis(cluster.url(), None).await;
    app.wait_ready().await;
    let voucher = app.open_async_voucher(50).await;
    let tokens = Arc::new(app.tokens(1..=150).await);
    let mut crowd = Vec::new();
    for user in 1..=150_i64 {
        let (client, base, tokens) = (app.client.clone(), app.base.clone(), tokens.clone());
        crowd.push(tokio::spawn(async move {
            let url = format!("{base}/seckill/{voucher}");
            (user, send_purchase(&client, &url, &tokens[&user]).await)
        }));
    }
    let mut accepted = Vec::new();
    for buyer in crowd {
        let (user, answer) = buyer.await.unwrap();
        match answer.status {
            StatusCode::ACCEPTED => {
                let order = answer.body["order_id"].as_str().unwrap().to_owned();
                accepted.push((user, order));
            }
            StatusCode::CONFLICT => assert_eq!(answer.body["error"], "sold_out"),
            other => panic!("{other}: {}", answer.body),
        }
    }
    assert_eq!(accepted.len(), 50, "accepted exactly the stock");
    // Every buyer finds their order by its id (its lookup key lives in
    // another slot than the sale's, written after the script), pending or
    // stored.
    for (user, order) in &accepted {
        let (status, body) = app.get_as(&format!("/orders/{order}"), &tokens[user]).await;
        assert_eq!(status, StatusCode::OK, "{order}: {body}");
    }
    let orders: Vec<String> = accepted.into_iter().map(|(_, order)| order).collect();
    app.wait_confirmed(&orders).await;
    assert_eq!(app.check_invariants(voucher).await, 50);
}
