//! The fair lock against real Redis: first come, first served, and dead
//! waiters do not block the line.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis_locks::{FairLock, Lease, LockGuard, WAITER_HEARTBEAT};

use crate::support::{held, refused, TestLocks, LEASE, SHORT_WATCHDOG_LEASE};

/// Waits (bounded) until `n` owners stand in line.
async fn line_reaches(lock: &FairLock, n: usize) {
    for _ in 0..1000 {
        if lock.queue().await.unwrap().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the line never reached {n}");
}

/// The fair lock the tests stand in line for, taken by "holder".
async fn held_tickets(locks: &TestLocks) -> (FairLock, LockGuard) {
    let lock = locks.fair_lock("tickets");
    let holder = held(
        lock.try_acquire(&locks.owner("holder"), LEASE).await,
        "the lock is free",
    );
    (lock, holder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_lock_in_the_order_they_asked() {
    let locks = TestLocks::new();
    let (lock, holder) = held_tickets(&locks).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 1..=5 {
        let order = order.clone();
        waiters.push(
            locks.spawn_as(format!("w{i}"), &lock, |lock, owner| async move {
                let guard = held(
                    lock.acquire(&owner, LEASE * 3, LEASE).await,
                    "its turn came",
                );
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(10)).await;
                guard.unlock().await.unwrap();
            }),
        );
        line_reaches(&lock, i).await;
    }
    // Nobody jumps the line, not even when the lock is free for a moment.
    refused(
        lock.try_acquire(&locks.owner("late"), LEASE).await,
        "the lock is held",
    );

    holder.unlock().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![1, 2, 3, 4, 5]);
    assert!(lock.queue().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_dies_with_a_long_wait_blocks_the_line_only_for_its_heartbeat() {
    let locks = TestLocks::new();
    let (lock, holder) = held_tickets(&locks).await;
    // A waiter that asked to wait a minute, and dies in line.
    let dead = locks.spawn_as("dead", &lock, |lock, owner| async move {
        lock.acquire(&owner, Duration::from_secs(60), LEASE).await
    });
    line_reaches(&lock, 1).await;
    dead.abort();
    let patient = locks.spawn_as("patient", &lock, |lock, owner| async move {
        let guard = lock.acquire(&owner, Duration::from_secs(60), LEASE).await;
        (guard, Instant::now())
    });
    line_reaches(&lock, 2).await;
    let freed = Instant::now();
    holder.unlock().await.unwrap();
    let (guard, got_it) = patient.await.unwrap();
    let guard = held(guard, "the patient waiter got the lock");
    // Its heartbeat window (5 s) after its last attempt, and a third of
    // that for the patient one's next attempt; never the dead one's minute.
    let waited = got_it - freed;
    assert!(
        waited < WAITER_HEARTBEAT * 2,
        "the dead waiter blocked the line for {waited:?}"
    );
    guard.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_is_skipped_when_its_wait_is_over() {
    let locks = TestLocks::new();
    let (lock, holder) = held_tickets(&locks).await;

    // A waiter that will wait 300 ms, and dies in line (its task is killed
    // before it can leave).
    let dead = locks.spawn_as("dead", &lock, |lock, owner| async move {
        lock.acquire(&owner, Duration::from_millis(300), LEASE)
            .await
    });
    line_reaches(&lock, 1).await;
    dead.abort();
    let patient = locks.spawn_as("patient", &lock, |lock, owner| async move {
        let guard = lock.acquire(&owner, LEASE, LEASE).await.unwrap();
        (guard, Instant::now())
    });
    line_reaches(&lock, 2).await;

    // Freed while the dead waiter still stands first: the patient one gets
    // the lock once the dead one's wait is over, long before its own.
    let freed = Instant::now();
    holder.unlock().await.unwrap();
    let (guard, got_it) = patient.await.unwrap();
    let guard = guard.expect("the patient waiter got the lock");
    assert!(
        got_it - freed < LEASE / 2,
        "the dead waiter blocked the line: {:?}",
        got_it - freed
    );
    assert!(
        lock.queue().await.unwrap().is_empty(),
        "the dead waiter is still in line"
    );
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn the_watchdog_keeps_a_fair_lock_alive_until_unlock() {
    let locks = TestLocks::with_watchdog();
    let lock = locks.fair_lock("tickets");
    let owner = locks.owner("long");
    let guard = held(
        lock.try_acquire(&owner, Lease::Watchdog).await,
        "the lock is free",
    );
    tokio::time::sleep(SHORT_WATCHDOG_LEASE * 3).await;
    assert!(
        lock.as_lock().is_held_by(&owner).await.unwrap(),
        "the lease ran out despite the watchdog"
    );
    guard.unlock().await.unwrap();
    assert_eq!(locks.watched_locks(), 0);
    assert!(!lock.as_lock().is_locked().await.unwrap());
}
