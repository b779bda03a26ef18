//! RedLock and MultiLock over three private Redis servers.

use std::time::Duration;

use redis_locks::{LockError, MultiGuard, MultiNodeLocks, Quorum};

use crate::support::{client_on, held, redis_conn, refused, OwnRedis, LEASE};

const NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// `n` private Redis servers, to be the lock nodes.
fn start_nodes(n: usize) -> Vec<OwnRedis> {
    (0..n).map(|_| OwnRedis::start()).collect()
}

/// Locks over these nodes (a client each) that need `quorum` of them.
fn locks_on(servers: &[OwnRedis], quorum: Quorum) -> MultiNodeLocks {
    let nodes = servers
        .iter()
        .map(|redis| client_on(&redis.url(), "", None))
        .collect();
    MultiNodeLocks::new(nodes, quorum)
}

/// An attempt at the lock `name` for the owner `id`, with the tests' lease
/// and node timeout.
async fn try_take(
    locks: &MultiNodeLocks,
    name: &str,
    id: &str,
) -> Result<Option<MultiGuard>, LockError> {
    locks.try_acquire(name, id, LEASE, NODE_TIMEOUT).await
}

/// An attempt that must have been undecided: only `answered` of the
/// `needed` nodes answered.
#[track_caller]
fn assert_unavailable(
    attempt: Result<Option<MultiGuard>, LockError>,
    answered: usize,
    needed: usize,
) {
    assert!(
        matches!(
            attempt,
            Err(LockError::NodesUnavailable { answered: a, needed: n })
                if (a, n) == (answered, needed)
        ),
        "{attempt:?}"
    );
}

/// Waits (2 s at most) until `n` nodes hold `guard`: the acquire returns
/// with the quorum's grants, and the others join as they come.
async fn joined_by(guard: &MultiGuard, n: usize) {
    let started = std::time::Instant::now();
    while guard.nodes() < n {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{} of {n} nodes joined the hold",
            guard.nodes()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(guard.nodes(), n);
}

async fn exists(redis: &OwnRedis, key: &str) -> bool {
    let mut conn = redis_conn(&redis.url()).await;
    redis::cmd("EXISTS")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn redlock_survives_one_node_of_three_and_refuses_with_two_down() {
    let mut servers = start_nodes(3);
    let locks = locks_on(&servers, Quorum::Majority);

    let first = held(
        try_take(&locks, "order:1", "a").await,
        "all three nodes grant a free lock",
    );
    joined_by(&first, 3).await;
    assert!(!first.is_expired());
    // Someone else cannot take it while it is first.
    refused(try_take(&locks, "order:1", "b").await, "the lock is held");

    // A node dies mid-hold: the hold stands, and releases on the others.
    servers[0].stop();
    assert_eq!(first.unlock().await, 2);
    for server in &servers[1..] {
        assert!(
            !exists(server, "lock:{order:1}").await,
            "a live node kept the lock"
        );
    }

    // With one node down, two of three still make a majority.
    let again = held(
        try_take(&locks, "order:1", "b").await,
        "two of three nodes are a majority",
    );
    assert_eq!(again.nodes(), 2);
    again.unlock().await;

    // With two down, one node is no majority: refused, and the one live
    // node does not keep what it granted.
    servers[1].stop();
    assert_unavailable(try_take(&locks, "order:1", "c").await, 1, 2);
    assert!(
        !exists(&servers[2], "lock:{order:1}").await,
        "a failed attempt left the lock on a node"
    );
}

#[tokio::test]
async fn a_multilock_needs_every_node() {
    let mut servers = start_nodes(3);
    let locks = locks_on(&servers, Quorum::All);
    let first = held(try_take(&locks, "order:2", "a").await, "all grant it");
    assert_eq!(first.unlock().await, 3);

    servers[2].stop();
    assert_unavailable(try_take(&locks, "order:2", "a").await, 2, 3);
    for server in &servers[..2] {
        assert!(
            !exists(server, "lock:{order:2}").await,
            "a refused multilock left a key behind"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn competing_redlock_holders_never_overlap() {
    let servers = start_nodes(3);
    // Two processes' worth of clients on the same three nodes.
    let first = locks_on(&servers, Quorum::Majority);
    let second = locks_on(&servers, Quorum::Majority);
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let locks = if i % 2 == 0 {
                first.clone()
            } else {
                second.clone()
            };
            let inside = inside.clone();
            tokio::spawn(async move {
                let guard = locks
                    .acquire(
                        "order:3",
                        &format!("task-{i}"),
                        Duration::from_secs(60),
                        LEASE,
                        NODE_TIMEOUT,
                    )
                    .await
                    .unwrap()
                    .expect("every task gets its turn");
                let before = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                assert_eq!(before, 0, "two holders at once");
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                guard.unlock().await;
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_answers_once_a_majority_has_without_waiting_for_frozen_nodes() {
    let servers = start_nodes(5);
    let locks = locks_on(&servers, Quorum::Majority);
    // Two of five frozen: they hold their connections and answer nothing.
    servers[3].freeze();
    servers[4].freeze();
    let node_timeout = Duration::from_secs(5);
    for round in 0..3 {
        let asked = std::time::Instant::now();
        let first = held(
            locks
                .try_acquire(&format!("order:{round}"), "a", LEASE, node_timeout)
                .await,
            "three live nodes of five grant a free lock",
        );
        let took = asked.elapsed();
        assert_eq!(first.nodes(), 3);
        // Not the frozen nodes' timeout: the majority's answer, and after
        // the first round the frozen nodes are not even asked.
        assert!(
            took < node_timeout / 2,
            "round {round} took {took:?} with a {node_timeout:?} node timeout"
        );
        assert_eq!(first.unlock().await, 3);
    }
    servers[3].thaw();
    servers[4].thaw();
}

/// Three nodes, the third frozen for less than the node timeout, and the
/// lock `name` taken by the two others: the frozen node's grant comes late.
async fn taken_with_a_node_frozen(name: &str) -> (Vec<OwnRedis>, MultiNodeLocks, MultiGuard) {
    let servers = start_nodes(3);
    let locks = locks_on(&servers, Quorum::Majority);
    servers[2].freeze();
    let guard = held(
        try_take(&locks, name, "a").await,
        "two of three grant a free lock",
    );
    (servers, locks, guard)
}

#[tokio::test]
async fn a_grant_after_the_quorum_joins_the_hold_and_is_given_back_with_it() {
    let (servers, _locks, guard) = taken_with_a_node_frozen("order:late").await;
    assert_eq!(guard.nodes(), 2, "the acquire waited for the frozen node");
    servers[2].thaw();
    joined_by(&guard, 3).await;
    assert_eq!(guard.unlock().await, 3);
    for server in &servers {
        assert!(
            !exists(server, "lock:{order:late}").await,
            "a node kept the lock"
        );
    }
}

#[tokio::test]
async fn a_grant_after_the_hold_was_given_back_is_given_back_too() {
    let (servers, locks, guard) = taken_with_a_node_frozen("order:gone").await;
    assert_eq!(guard.unlock().await, 2);
    // The frozen node applies the grant when it thaws, after the release;
    // it is given back then, long before its lease would end.
    servers[2].thaw();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !exists(&servers[2], "lock:{order:gone}").await,
        "a late grant outlived its hold's release"
    );
    // Free again on every node.
    let next = held(
        try_take(&locks, "order:gone", "b").await,
        "the released lock is free",
    );
    joined_by(&next, 3).await;
    next.unlock().await;
}

#[tokio::test]
async fn a_redlock_wait_that_runs_out_with_too_few_nodes_is_unknown_not_held() {
    let mut servers = start_nodes(3);
    let locks = locks_on(&servers, Quorum::Majority);
    servers[0].stop();
    servers[1].stop();
    let waited = locks
        .acquire(
            "order:3",
            "a",
            Duration::from_millis(300),
            LEASE,
            NODE_TIMEOUT,
        )
        .await;
    // Ok(None) before: "someone holds it", which nobody could know.
    assert!(
        matches!(waited, Err(LockError::NodesUnavailable { .. })),
        "{:?}",
        waited.map(|g| g.is_some())
    );
}
