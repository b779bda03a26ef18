//! The reentrant lock against real Redis.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_locks::{Acquired, Lease, Lock, LockClient, LockError, LockGuard, Owner, Released};

use crate::support::{
    client_on, command_calls, delete_behind_its_back, held, redis_conn, redis_url, OwnRedis,
    TestLocks, LEASE, SHORT_WATCHDOG_LEASE,
};

#[track_caller]
fn acquired(result: Result<Acquired, LockError>) -> LockGuard {
    match result {
        Ok(Acquired::Yes(guard)) => guard,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

/// A lock client of the test's own (see [`TestLocks`]) and its lock `name`.
fn new_lock(name: &str) -> (TestLocks, Lock) {
    let locks = TestLocks::new();
    let lock = locks.lock(name);
    (locks, lock)
}

/// The hold `owner` must get on `lock` at once.
async fn take(lock: &Lock, owner: &Owner, lease: impl Into<Lease>) -> LockGuard {
    acquired(lock.try_acquire(owner, lease).await)
}

/// Asserts that less than `bound` has passed since `since`.
#[track_caller]
fn assert_within(since: Instant, bound: Duration, otherwise: &str) {
    let took = since.elapsed();
    assert!(took < bound, "{otherwise}: {took:?}");
}

/// A release (or unlock) that must have been refused: the owner holds no
/// hold on the lock (any more).
#[track_caller]
fn assert_not_held<T: std::fmt::Debug>(release: Result<T, LockError>) {
    assert!(
        matches!(release, Err(LockError::NotHeld { .. })),
        "{release:?}"
    );
}

async fn raw_hash(key: &str) -> Vec<(String, String)> {
    let mut conn = redis_conn(&redis_url()).await;
    let mut fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap();
    fields.sort();
    fields
}

#[tokio::test]
async fn the_same_owner_reenters_and_the_last_release_frees() {
    let (locks, lock) = new_lock("order:1");
    let owner = locks.owner("request-1");

    let outer = take(&lock, &owner, LEASE).await;
    let inner = take(&lock, &owner, LEASE).await;
    assert_eq!(lock.hold_count(&owner).await.unwrap(), 2);
    // The owner's holds, and its record of its last request (see
    // lua/lock_acquire.lua): nothing of anyone else.
    let fields = raw_hash(lock.key()).await;
    assert_eq!(fields.len(), 2, "{fields:?}");
    assert_eq!(fields[0], (owner.to_string(), "2".to_owned()));
    assert_eq!(fields[1].0, format!("req:{owner}"));
    assert!(fields[1].1.starts_with("2 "), "{fields:?}");
    assert!(owner.as_str().starts_with(&locks.process_id().to_string()));

    // Another owner of the same process is someone else.
    let other = locks.owner("request-2");
    match lock.try_acquire(&other, LEASE).await.unwrap() {
        Acquired::HeldByOther { lease_left } => {
            let left = lease_left.expect("the lock has a lease");
            assert!(left > Duration::from_secs(5) && left <= LEASE, "{left:?}");
        }
        Acquired::Yes(_) => panic!("a second owner got a held lock"),
    }

    assert_eq!(inner.unlock().await.unwrap(), Released::StillHeld(1));
    assert!(lock.is_locked().await.unwrap());
    assert_eq!(outer.unlock().await.unwrap(), Released::Free);
    assert!(!lock.is_locked().await.unwrap());
    take(&lock, &other, LEASE).await.unlock().await.unwrap();
}

#[tokio::test]
async fn a_reentry_or_release_with_a_shorter_lease_never_cuts_the_lock_short() {
    let (locks, lock) = new_lock("order:short");
    let owner = locks.owner("request-1");
    let outer = take(&lock, &owner, LEASE).await;
    // Taken again, and given back, with a lease far shorter than the
    // outer hold's: the lock keeps the longer one.
    let inner = take(&lock, &owner, Duration::from_millis(100)).await;
    let again = take(&lock, &owner, Duration::from_millis(100)).await;
    assert_eq!(again.unlock().await.unwrap(), Released::StillHeld(2));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = locks.owner("request-2");
    match lock.try_acquire(&other, LEASE).await.unwrap() {
        Acquired::HeldByOther { lease_left } => {
            let left = lease_left.expect("the lock has a lease");
            assert!(left > Duration::from_secs(5), "{left:?}");
        }
        Acquired::Yes(_) => panic!("a second owner got the lock while its owner held it"),
    }
    assert_eq!(inner.unlock().await.unwrap(), Released::StillHeld(1));
    assert_eq!(outer.unlock().await.unwrap(), Released::Free);
}

#[tokio::test]
async fn a_release_by_someone_else_changes_nothing_and_is_reported() {
    let (locks, lock) = new_lock("order:2");
    let owner = locks.owner("holder");
    let guard = take(&lock, &owner, LEASE).await;
    let before = raw_hash(lock.key()).await;

    // Another owner in this process, and the same id in another process.
    let strangers = [locks.owner("stranger"), TestLocks::new().owner("holder")];
    for stranger in &strangers {
        match lock.release(stranger, LEASE).await {
            Err(LockError::NotHeld { .. }) => {}
            other => panic!("a stranger's release returned {other:?}"),
        }
    }
    assert_eq!(raw_hash(lock.key()).await, before);
    assert_eq!(lock.hold_count(&owner).await.unwrap(), 1);
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn an_expired_lease_frees_the_lock_and_the_late_release_is_reported() {
    let (locks, lock) = new_lock("order:3");
    let guard = take(&lock, &locks.owner("slow"), Duration::from_millis(100)).await;
    tokio::time::sleep(Duration::from_millis(250)).await;

    let next = locks.owner("next");
    let next_guard = take(&lock, &next, LEASE).await;
    assert_not_held(guard.unlock().await);
    // The late release did not touch the new holder's lock.
    assert_eq!(lock.hold_count(&next).await.unwrap(), 1);
    next_guard.unlock().await.unwrap();
}

#[tokio::test]
async fn a_dropped_guard_releases_and_shutdown_waits_for_it() {
    let (locks, lock) = new_lock("order:4");
    drop(take(&lock, &locks.owner("dropped"), LEASE).await);
    assert!(
        locks.shutdown(Duration::from_secs(5)).await,
        "the release finished"
    );
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test]
async fn a_waiter_gives_up_when_its_wait_time_is_spent() {
    let (locks, lock) = new_lock("order:5");
    let holder = take(&lock, &locks.owner("holder"), LEASE).await;
    let asked = Instant::now();
    let got = lock
        .acquire(&locks.owner("waiter"), Duration::from_millis(300), LEASE)
        .await
        .unwrap();
    let waited = asked.elapsed();
    assert!(got.is_none(), "took a held lock");
    assert!(
        waited >= Duration::from_millis(300),
        "gave up early: {waited:?}"
    );
    assert!(waited < LEASE / 2, "overslept its wait time: {waited:?}");
    holder.unlock().await.unwrap();
}

#[tokio::test]
async fn a_waiter_wakes_on_unlock_long_before_the_lease_ends() {
    let (locks, lock) = new_lock("order:6");
    let holder = take(&lock, &locks.owner("holder"), LEASE).await;
    let waiter = locks.spawn_as("waiter", &lock, |lock, owner| async move {
        let guard = lock.acquire(&owner, LEASE, LEASE).await.unwrap();
        (guard, Instant::now())
    });
    // Bounded wait until the waiter listens on the lock's channel.
    for _ in 0..500 {
        if locks.waiting_channels() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        locks.waiting_channels(),
        1,
        "the waiter listens on the lock's channel"
    );
    let released = Instant::now();
    holder.unlock().await.unwrap();
    let (guard, woke) = waiter.await.unwrap();
    let guard = guard.expect("the waiter got the lock");
    let delay = woke - released;
    eprintln!("wake-up delay after unlock: {delay:?}");
    assert!(
        delay < LEASE / 2,
        "woke by the lease, not the unlock: {delay:?}"
    );
    guard.unlock().await.unwrap();
}

/// A proxy to the local Redis that forwards every connection while
/// `silent` is false and holds new ones open and unanswered while it is
/// true (a server that accepts and never replies). Its address.
async fn silencing_proxy(silent: Arc<AtomicBool>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let target = testkit::redis_addr();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (silent, target) = (silent.load(Ordering::SeqCst), target.clone());
            tokio::spawn(async move {
                if silent {
                    let mut sink = Vec::new();
                    let _ = tokio::io::AsyncReadExt::read_to_end(&mut socket, &mut sink).await;
                } else if let Ok(mut server) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut socket, &mut server).await;
                }
            });
        }
    });
    format!("redis://{addr}")
}

#[tokio::test]
async fn a_subscription_redis_never_confirms_ends_at_the_deadline_and_the_next_waiter_connects_anew(
) {
    let silent = Arc::new(AtomicBool::new(false));
    let (locks, lock) = new_lock("order:silent");
    let holder = take(&lock, &locks.owner("holder"), LEASE).await;
    // Waiters of another client whose connections pass the proxy: its
    // command connection opens while the proxy forwards, its subscriber
    // connection (opened on the first wait) while it is silent.
    let via = client_on(&silencing_proxy(silent.clone()).await, locks.prefix(), None);
    let theirs = via.lock("order:silent");
    assert!(!matches!(
        theirs.try_acquire(&locks.owner("first"), LEASE).await,
        Ok(Acquired::Yes(_))
    ));
    silent.store(true, Ordering::SeqCst);
    let asked = Instant::now();
    let waited = tokio::time::timeout(LEASE, theirs.acquire(&locks.owner("first"), LEASE, LEASE))
        .await
        .expect("the wait ended within its deadline, not only the test's");
    let took = asked.elapsed();
    match waited {
        Err(LockError::Redis(error)) => {
            assert!(error.is_timeout(), "{error}");
            assert!(error.to_string().contains("subscription"), "{error}");
        }
        other => panic!("no subscription, no wait: {other:?}"),
    }
    // The command deadline (2 s), with room for a busy machine.
    assert!(took < via.command_timeout() * 2, "took {took:?}");
    // The next waiter is not stuck behind the silent connection: it
    // connects anew and wakes on the unlock.
    silent.store(false, Ordering::SeqCst);
    let waiter = tokio::spawn({
        let (theirs, owner) = (theirs.clone(), locks.owner("second"));
        async move { theirs.acquire(&owner, LEASE, LEASE).await }
    });
    for _ in 0..500 {
        if via.waiting_channels() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let released = Instant::now();
    holder.unlock().await.unwrap();
    let guard = held(waiter.await.unwrap(), "woken by the unlock");
    assert_within(released, LEASE / 2, "woke by the lease, not the unlock");
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn a_waiter_takes_a_lock_whose_lease_ran_out_without_a_message() {
    let (locks, lock) = new_lock("order:7");
    let crashed = take(&lock, &locks.owner("crashed"), Duration::from_millis(300)).await;
    std::mem::forget(crashed); // a holder that never releases
    let asked = Instant::now();
    let guard = held(
        lock.acquire(&locks.owner("waiter"), LEASE, LEASE).await,
        "the lease ran out",
    );
    assert_within(asked, LEASE / 2, "slept past the holder's lease");
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn force_unlock_frees_the_lock_and_wakes_its_waiters() {
    let (locks, lock) = new_lock("order:8");
    let holder = locks.owner("holder");
    let guard = take(&lock, &holder, LEASE).await;
    assert!(lock.is_held_by(&holder).await.unwrap());
    let lease = held(lock.remaining_lease().await, "a held lock has a lease");
    assert!(lease > LEASE / 2 && lease <= LEASE, "{lease:?}");

    let waiter = locks.spawn_as("waiter", &lock, |lock, owner| async move {
        lock.acquire(&owner, LEASE, LEASE).await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let forced = Instant::now();
    assert!(lock.force_unlock().await.unwrap());
    let next = waiter.await.unwrap().expect("the waiter got the lock");
    assert!(forced.elapsed() < LEASE / 2);
    assert!(!lock.is_held_by(&holder).await.unwrap());
    assert_not_held(guard.unlock().await);
    next.unlock().await.unwrap();
    assert!(
        !lock.force_unlock().await.unwrap(),
        "a free lock reports nothing to free"
    );
    assert_eq!(lock.remaining_lease().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_tasks_on_four_clients_count_exactly_and_leave_nothing_behind() {
    let first = TestLocks::new();
    let prefix = first.prefix();
    let clients: Vec<LockClient> = (0..4).map(|_| first.another_client()).collect();
    let counter = format!("{prefix}counter");
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let locks = clients[i % 4].clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                let lock = locks.lock("counter");
                let owner = locks.owner(format!("task-{i}"));
                let guard = held(
                    lock.acquire(&owner, Duration::from_secs(60), LEASE).await,
                    "every task gets its turn",
                );
                // Read, yield, write: without the lock, updates get lost.
                let client = redis::Client::open(redis_url()).unwrap();
                let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                let n: i64 = redis::cmd("GET")
                    .arg(&counter)
                    .query_async::<Option<i64>>(&mut conn)
                    .await
                    .unwrap()
                    .unwrap_or(0);
                tokio::task::yield_now().await;
                redis::cmd("SET")
                    .arg(&counter)
                    .arg(n + 1)
                    .query_async::<()>(&mut conn)
                    .await
                    .unwrap();
                guard.unlock().await.unwrap();
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let mut conn = redis_conn(&redis_url()).await;
    let n: i64 = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 100);

    // No lock key: only the fencing-token key, which keeps the last token
    // and the answer of the last release, and expires; and (once the
    // unsubscribes have gone out) no channel. A release leaves no key of
    // its own.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}lock:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let base = format!("{prefix}lock:{{counter}}");
    assert_eq!(keys, vec![format!("{base}:fence")], "lock keys left");
    for key in &keys {
        let ttl = crate::support::pttl(key).await;
        assert!(ttl > 0, "{key} never expires");
    }
    assert!(clients.iter().all(|c| c.waiting_channels() == 0));
    let mut channels: Vec<String> = Vec::new();
    for _ in 0..50 {
        channels = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg(format!("{prefix}*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if channels.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        channels.is_empty(),
        "channels left subscribed: {channels:?}"
    );
}

#[tokio::test]
async fn the_watchdog_keeps_a_lock_past_three_leases_and_stops_after_unlock() {
    let locks = TestLocks::with_watchdog();
    let lock = locks.lock("order:9");
    let owner = locks.owner("long-job");
    let guard = take(&lock, &owner, Lease::Watchdog).await;
    assert_eq!(locks.watched_locks(), 1);

    tokio::time::sleep(SHORT_WATCHDOG_LEASE * 3).await;
    assert!(
        lock.is_held_by(&owner).await.unwrap(),
        "the lease ran out despite the watchdog"
    );
    assert!(!guard.is_lost());
    let left = held(lock.remaining_lease().await, "a renewed lease");
    assert!(left <= SHORT_WATCHDOG_LEASE);

    assert_eq!(guard.unlock().await.unwrap(), Released::Free);
    assert_eq!(
        locks.watched_locks(),
        0,
        "the watchdog still renews an unlocked lock"
    );

    // A dropped guard stops the renewals too.
    let guard = take(&lock, &owner, Lease::Watchdog).await;
    drop(guard);
    assert_eq!(locks.watched_locks(), 0);
    assert!(locks.shutdown(Duration::from_secs(5)).await);
    assert!(!lock.is_locked().await.unwrap());
}

#[test]
fn the_watchdog_renews_on_a_new_runtime_after_its_first_runtime_ended() {
    let locks = TestLocks::with_watchdog();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    // A hold on a runtime that ends: the renewal task ends with it.
    let first = runtime();
    first.block_on(async {
        let guard = take(
            &locks.lock("order:first"),
            &locks.owner("a"),
            Lease::Watchdog,
        )
        .await;
        std::mem::forget(guard);
    });
    drop(first);
    // The next watched hold, on another runtime, is renewed all the same.
    runtime().block_on(async {
        let lock = locks.lock("order:second");
        let owner = locks.owner("b");
        let guard = take(&lock, &owner, Lease::Watchdog).await;
        tokio::time::sleep(SHORT_WATCHDOG_LEASE * 2).await;
        assert!(!guard.is_lost(), "told lost: no renewal task ran");
        assert!(lock.is_held_by(&owner).await.unwrap());
        guard.unlock().await.unwrap();
    });
}

#[tokio::test]
async fn a_holder_hears_its_lock_is_lost_by_the_time_its_lease_can_run_out_while_redis_is_frozen() {
    let redis = OwnRedis::start();
    let lease = Duration::from_millis(600);
    let locks = client_on(&redis.url(), "", Some(lease));
    let guard = take(
        &locks.lock("order:frozen"),
        &locks.owner("holder"),
        Lease::Watchdog,
    )
    .await;
    tokio::time::sleep(lease).await;
    assert!(!guard.is_lost());
    // Every renewal sent from now on hangs for the command's deadline
    // (2 s, longer than the lease); the last one confirmed was sent before
    // this, so the key can be gone a lease after it.
    let frozen = Instant::now();
    redis.freeze();
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the lost signal fired");
    let heard = frozen.elapsed();
    redis.thaw();
    // A busy machine's timers: 200 ms of slack, well short of the deadline.
    assert!(
        heard <= lease + Duration::from_millis(200),
        "told {heard:?} after the freeze; the lease can have ended {lease:?} after it"
    );
}

#[tokio::test]
async fn the_holder_hears_at_once_when_its_lock_is_deleted() {
    let locks = TestLocks::on(&redis_url(), Some(Duration::from_millis(600)));
    let lock = locks.lock("order:10");
    let guard = take(&lock, &locks.owner("holder"), Lease::Watchdog).await;

    delete_behind_its_back(&redis_url(), lock.key()).await;

    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the lost signal fired");
    assert!(guard.is_lost());
    assert_eq!(locks.watched_locks(), 0);
    assert_not_held(guard.unlock().await);
}

#[tokio::test]
async fn the_holder_hears_when_redis_restarts_and_loses_the_lock() {
    let mut redis = OwnRedis::start();
    let locks = client_on(&redis.url(), "", Some(Duration::from_millis(600)));
    let lock = locks.lock("order:11");
    let guard = take(&lock, &locks.owner("holder"), Lease::Watchdog).await;

    redis.stop();
    redis.restart();
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the lost signal fired");
    assert!(guard.is_lost());
    // The client works again on the restarted server.
    let again = take(&lock, &locks.owner("next"), Duration::from_secs(5)).await;
    again.unlock().await.unwrap();
}

#[tokio::test]
async fn a_fixed_lease_hold_is_lost_when_its_lease_runs_out() {
    let (locks, lock) = new_lock("order:12");
    let guard = take(&lock, &locks.owner("brief"), Duration::from_millis(200)).await;
    assert!(!guard.is_lost());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() resolves at the end of the lease");
    assert!(guard.is_lost());
}

#[tokio::test]
async fn every_new_holder_gets_a_larger_fencing_token_and_reentry_keeps_it() {
    let (locks, lock) = new_lock("order:13");
    let (a, b) = (locks.owner("a"), locks.owner("b"));
    let mut last = 0;
    for owner in [&a, &b, &a, &b] {
        let outer = take(&lock, owner, LEASE).await;
        let inner = take(&lock, owner, LEASE).await;
        assert!(outer.fence() > last, "token {} after {last}", outer.fence());
        assert_eq!(
            inner.fence(),
            outer.fence(),
            "reentry keeps the holder's token"
        );
        last = outer.fence();
        inner.unlock().await.unwrap();
        outer.unlock().await.unwrap();
    }
    // Even with the token key gone, the next token is larger (Redis's clock).
    let mut conn = redis_conn(&redis_url()).await;
    redis::cmd("DEL")
        .arg(format!("{}:fence", lock.key()))
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let guard = take(&lock, &a, LEASE).await;
    assert!(guard.fence() > last);
    guard.unlock().await.unwrap();

    // A last token ahead of Redis's clock (the clock went back, or a new
    // master's is behind): the next token still passes it, whether the key
    // holds the token alone or the token and a last release's request id.
    let ahead: i64 = 9_000_000_000_000_000;
    for value in [ahead.to_string(), format!("{ahead} some-release")] {
        redis::cmd("SET")
            .arg(format!("{}:fence", lock.key()))
            .arg(&value)
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        let guard = take(&lock, &a, LEASE).await;
        assert_eq!(guard.fence(), ahead + 1, "after {value:?}");
        guard.unlock().await.unwrap();
    }
}

#[tokio::test]
async fn a_resent_acquire_or_release_does_not_count_twice() {
    let (locks, lock) = new_lock("order:14");
    let owner = locks.owner("retrying");

    // The same acquisition sent twice (its first answer lost in transit).
    let first = acquired(lock.try_acquire_request(&owner, LEASE, "acquire-1").await);
    let resent = acquired(lock.try_acquire_request(&owner, LEASE, "acquire-1").await);
    assert_eq!(
        lock.hold_count(&owner).await.unwrap(),
        1,
        "a resent acquire took a second hold"
    );
    assert_eq!(resent.fence(), first.fence());
    std::mem::forget(resent); // the same hold as `first`, not a second one

    // A genuine second acquisition counts.
    let second = acquired(lock.try_acquire_request(&owner, LEASE, "acquire-2").await);
    assert_eq!(lock.hold_count(&owner).await.unwrap(), 2);
    std::mem::forget(second);

    // The same release sent twice gives back one hold.
    assert_eq!(
        lock.release_request(&owner, LEASE, "release-1")
            .await
            .unwrap(),
        Released::StillHeld(1)
    );
    assert_eq!(
        lock.release_request(&owner, LEASE, "release-1")
            .await
            .unwrap(),
        Released::StillHeld(1)
    );
    assert_eq!(
        lock.hold_count(&owner).await.unwrap(),
        1,
        "a resent release gave back a second hold"
    );

    // The last release, sent twice: the lock's hash is gone after the
    // first, and the resend still gets the first answer, not "not held".
    for _ in 0..2 {
        assert_eq!(
            lock.release_request(&owner, LEASE, "release-2")
                .await
                .unwrap(),
            Released::Free
        );
    }
    assert!(!lock.is_locked().await.unwrap());
    std::mem::forget(first); // released above, under the test's own ids

    // Another request that finds no hold is refused as before.
    assert_not_held(lock.release_request(&owner, LEASE, "release-3").await);

    // The answer is kept until the lock is next taken: the new holder's
    // fencing token replaces it, and a resend that late is told the truth,
    // that the owner holds nothing.
    let other = locks.owner("next");
    let next = acquired(lock.try_acquire(&other, LEASE).await);
    assert_not_held(lock.release_request(&owner, LEASE, "release-2").await);
    assert!(lock.is_locked().await.unwrap(), "the new hold stands");
    next.unlock().await.unwrap();
}

#[tokio::test]
async fn a_resent_acquire_whose_hold_has_ended_takes_no_hold_it_did_not_win() {
    let (locks, lock) = new_lock("order:15");
    let owner = locks.owner("first");
    let other = locks.owner("second");

    // The first send took the lock; its hold ended (released here) and
    // another owner took the lock before the resend came.
    let first = acquired(lock.try_acquire_request(&owner, LEASE, "acquire-1").await);
    assert_eq!(first.unlock().await.unwrap(), Released::Free);
    let next = take(&lock, &other, LEASE).await;
    match lock
        .try_acquire_request(&owner, LEASE, "acquire-1")
        .await
        .unwrap()
    {
        Acquired::HeldByOther { .. } => {}
        Acquired::Yes(_) => panic!("a resend took a lock another owner holds"),
    }
    assert_eq!(lock.hold_count(&owner).await.unwrap(), 0);
    assert_eq!(next.unlock().await.unwrap(), Released::Free);
}

/// A private Redis whose script calls a test counts, two lock clients on
/// it (another process, as far as the locks can tell), and a connection for
/// `INFO commandstats`. The lock scripts are loaded already, so that no
/// NOSCRIPT round is counted.
async fn two_clients_counted() -> (
    OwnRedis,
    LockClient,
    LockClient,
    redis::aio::MultiplexedConnection,
) {
    let redis = OwnRedis::start();
    let locks = client_on(&redis.url(), "", None);
    let other_client = client_on(&redis.url(), "", None);
    let conn = redis_conn(&redis.url()).await;
    let warm = locks.lock("warm-up");
    take(&warm, &locks.owner("w"), LEASE)
        .await
        .unlock()
        .await
        .unwrap();
    (redis, locks, other_client, conn)
}

#[tokio::test]
async fn unlock_all_gives_back_many_holds_in_one_call_each_answered_as_unlock_would() {
    let (_redis, locks, other_client, mut conn) = two_clients_counted().await;

    // Ten locks of one owner each; one of them held twice; one whose
    // lease runs out before the release; one of another client.
    let mut guards = Vec::new();
    for i in 0..10 {
        let lock = locks.lock(&format!("order:{i}"));
        guards.push(take(&lock, &locks.owner(i), LEASE).await);
    }
    let twice = locks.lock("order:3");
    let reentered = take(&twice, &locks.owner(3), LEASE).await;
    let short = locks.lock("order:short");
    guards.push(take(&short, &locks.owner("short"), Duration::from_millis(50)).await);
    let foreign = other_client.lock("order:foreign");
    guards.push(take(&foreign, &other_client.owner("f"), LEASE).await);
    // A waiter on one of them hears its release.
    let waited = locks.lock("order:7");
    let waiter = {
        let waited = waited.clone();
        let owner = locks.owner("waiter");
        tokio::spawn(async move {
            let started = Instant::now();
            let guard = waited
                .acquire(&owner, Duration::from_secs(5), LEASE)
                .await
                .unwrap()
                .expect("the waiter got the lock");
            (started.elapsed(), guard)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    let before = command_calls(&mut conn, "evalsha").await;
    let answers = locks.unlock_all(guards).await;
    let calls = command_calls(&mut conn, "evalsha").await - before;
    // One call for this client's twelve, one (an unlock) for the foreign
    // guard; the waiter's acquire may add one more.
    assert!(
        (2..=3).contains(&calls),
        "{calls} script calls for twelve holds"
    );

    assert_eq!(answers.len(), 12);
    for (i, answer) in answers.iter().enumerate() {
        match i {
            3 => assert_eq!(
                answer.as_ref().unwrap(),
                &Released::StillHeld(1),
                "lock {i}"
            ),
            10 => assert!(
                matches!(answer, Err(LockError::NotHeld { .. })),
                "{answer:?}"
            ),
            _ => assert_eq!(answer.as_ref().unwrap(), &Released::Free, "lock {i}"),
        }
    }
    for i in (0..10).filter(|i| ![3, 7].contains(i)) {
        assert!(!locks.lock(&format!("order:{i}")).is_locked().await.unwrap());
    }
    assert_eq!(twice.hold_count(&locks.owner(3)).await.unwrap(), 1);
    assert!(!foreign.is_locked().await.unwrap());

    let (waited_for, guard) = waiter.await.unwrap();
    assert!(
        waited_for < LEASE / 2,
        "the waiter slept {waited_for:?} instead of hearing the release"
    );
    guard.unlock().await.unwrap();
    assert_eq!(reentered.unlock().await.unwrap(), Released::Free);
    // Nothing is given back twice when the released guards drop: the two
    // calls of unlock_all, the waiter's attempt after the release, the two
    // unlocks just above.
    assert!(locks.shutdown(Duration::from_secs(5)).await);
    assert!(other_client.shutdown(Duration::from_secs(5)).await);
    assert_eq!(command_calls(&mut conn, "evalsha").await, before + 5);
}

#[tokio::test]
async fn try_acquire_all_tries_many_locks_in_one_call_each_answered_as_try_acquire_would() {
    let (_redis, locks, other_client, mut conn) = two_clients_counted().await;

    // Lock 0 is held by someone else; lock 1 already by its owner (who
    // reenters); the others are free; one is another client's.
    let names: Vec<Lock> = (0..8).map(|i| locks.lock(&format!("order:{i}"))).collect();
    let owners: Vec<Owner> = (0..8).map(|i| locks.owner(i)).collect();
    let holder = take(&names[0], &locks.owner("holder"), LEASE).await;
    let first_hold = take(&names[1], &owners[1], LEASE).await;
    let foreign = other_client.lock("order:foreign");
    let foreign_owner = other_client.owner("f");
    let mut requests: Vec<(&Lock, &Owner, Lease)> = names
        .iter()
        .zip(&owners)
        .map(|(lock, owner)| (lock, owner, Lease::Fixed(LEASE)))
        .collect();
    requests.push((&foreign, &foreign_owner, Lease::Fixed(LEASE)));

    let before = command_calls(&mut conn, "evalsha").await;
    let answers = locks.try_acquire_all(&requests).await;
    let calls = command_calls(&mut conn, "evalsha").await - before;
    assert_eq!(
        calls, 2,
        "one call for this client's eight, one for the other's"
    );

    let mut guards = Vec::new();
    for (i, answer) in answers.into_iter().enumerate() {
        match (i, answer.unwrap()) {
            (0, Acquired::HeldByOther { lease_left }) => {
                assert!(lease_left.is_some_and(|left| left <= LEASE));
            }
            (0, other) => panic!("lock 0 is held by another owner: {other:?}"),
            (_, Acquired::Yes(guard)) => guards.push(guard),
            (i, other) => panic!("lock {i} should be taken: {other:?}"),
        }
    }
    assert_eq!(guards.len(), 8);
    // The reentry keeps the first hold's token; a new holder's is larger
    // than any before on its lock.
    assert_eq!(guards[0].fence(), first_hold.fence());
    assert_eq!(names[1].hold_count(&owners[1]).await.unwrap(), 2);
    for (lock, owner) in names.iter().zip(&owners).skip(2) {
        assert!(lock.is_held_by(owner).await.unwrap());
    }
    assert!(foreign.is_held_by(&foreign_owner).await.unwrap());

    let foreign_guard = guards.pop().unwrap();
    assert_eq!(foreign_guard.unlock().await.unwrap(), Released::Free);
    for answer in locks.unlock_all(guards).await {
        answer.unwrap();
    }
    assert_eq!(first_hold.unlock().await.unwrap(), Released::Free);
    holder.unlock().await.unwrap();
    for lock in &names {
        assert!(!lock.is_locked().await.unwrap());
    }
}

#[tokio::test]
async fn a_lease_or_a_wait_of_duration_max_holds_with_an_expiry_and_does_not_panic() {
    // "For ever", written the usual way: the lease was sent as u64::MAX
    // ms, which PEXPIRE refused after the hold was written (a key held
    // with no expiry, and an error); the wait overflowed the clock.
    let locks = TestLocks::new();
    let lock = locks.lock("forever");
    let owner = locks.owner("a");
    let guard = lock
        .acquire(&owner, Duration::MAX, Lease::Fixed(Duration::MAX))
        .await
        .unwrap()
        .expect("a free lock is taken at once");
    assert!(!guard.is_lost());
    let ttl = crate::support::pttl(lock.key()).await;
    assert!(ttl > 0, "the lock's key has no expiry: {ttl}");
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn a_guard_whose_lease_ran_out_cannot_give_back_its_owners_next_hold() {
    // A job's worker stalls past its lease; a retry of the same job (the
    // same owner) takes the lock again; the stalled worker, resuming,
    // gives its guard back. That hold is another tenure's: before, the
    // owner's name was all the release checked, the retry's hold was
    // deleted and a third owner could take the lock beside it.
    let (locks, lock) = new_lock("job-7");
    let job = locks.owner("job-7");
    let stalled = take(&lock, &job, Lease::Fixed(Duration::from_millis(100))).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let retry = take(&lock, &job, LEASE).await;
    assert!(retry.fence() > stalled.fence());
    assert!(
        matches!(stalled.unlock().await, Err(LockError::NotHeld { .. })),
        "a stale guard gave back a later hold"
    );
    match lock
        .try_acquire(&locks.owner("other"), LEASE)
        .await
        .unwrap()
    {
        Acquired::HeldByOther { .. } => {}
        Acquired::Yes(_) => panic!("a third owner took the retry's lock"),
    }
    assert_eq!(retry.unlock().await.unwrap(), Released::Free);
}
