//! The read-write lock against real Redis.

use std::time::{Duration, Instant};

use redis_locks::{Hold, Lease, ReadWriteLock};

use crate::support::{
    delete_behind_its_back, held, redis_url, refused, TestLocks, LEASE, SHORT_WATCHDOG_LEASE,
};

/// A lock client of the test's own (see [`TestLocks`]) and its read-write
/// lock "catalog".
fn new_catalog() -> (TestLocks, ReadWriteLock) {
    let locks = TestLocks::new();
    let lock = locks.read_write_lock("catalog");
    (locks, lock)
}

#[tokio::test]
async fn many_readers_or_one_writer() {
    let (locks, lock) = new_catalog();
    let (r1, r2, w) = (locks.owner("r1"), locks.owner("r2"), locks.owner("w"));

    let read1 = held(lock.try_read(&r1, LEASE).await, "a free lock reads");
    let read2 = held(lock.try_read(&r2, LEASE).await, "readers share");
    assert_eq!(lock.mode().await.unwrap(), Some(Hold::Read));
    refused(
        lock.try_write(&w, LEASE).await,
        "a writer got in beside readers",
    );
    refused(lock.try_write(&r1, LEASE).await, "a reader upgraded");

    assert_eq!(read1.unlock().await.unwrap(), 0);
    refused(
        lock.try_write(&w, LEASE).await,
        "a writer got in beside a reader",
    );
    assert_eq!(read2.unlock().await.unwrap(), 0);
    assert_eq!(lock.mode().await.unwrap(), None);

    let write = held(lock.try_write(&w, LEASE).await, "a free lock writes");
    let again = held(lock.try_write(&w, LEASE).await, "the writer reenters");
    refused(
        lock.try_read(&r1, LEASE).await,
        "a reader got in beside a writer",
    );
    refused(lock.try_write(&r1, LEASE).await, "two writers");
    assert_eq!(again.unlock().await.unwrap(), 1);
    assert_eq!(write.unlock().await.unwrap(), 0);
    assert_eq!(lock.mode().await.unwrap(), None);
}

#[tokio::test]
async fn a_writer_downgrades_to_a_reader() {
    let (locks, lock) = new_catalog();
    let (w, other) = (locks.owner("w"), locks.owner("other"));

    let write = lock.try_write(&w, LEASE).await.unwrap().unwrap();
    let read = held(lock.try_read(&w, LEASE).await, "the writer may read");
    refused(lock.try_read(&other, LEASE).await, "held by another");
    write.unlock().await.unwrap();
    assert_eq!(
        lock.mode().await.unwrap(),
        Some(Hold::Read),
        "write -> read downgrade"
    );
    let shared = held(lock.try_read(&other, LEASE).await, "now others read too");
    refused(lock.try_write(&other, LEASE).await, "held by another");
    read.unlock().await.unwrap();
    shared.unlock().await.unwrap();
    assert_eq!(lock.mode().await.unwrap(), None);
}

#[tokio::test]
async fn an_expired_reader_does_not_hold_the_lock_once_the_others_leave() {
    let (locks, lock) = new_catalog();
    let dead = held(
        lock.try_read(&locks.owner("dies"), Duration::from_millis(150))
            .await,
        "the lock is free",
    );
    std::mem::forget(dead); // a reader that crashed
    let alive = held(
        lock.try_read(&locks.owner("lives"), LEASE).await,
        "the lock is free",
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    alive.unlock().await.unwrap();
    assert_eq!(
        lock.mode().await.unwrap(),
        None,
        "the dead reader's hold kept the lock"
    );
    let write = held(
        lock.try_write(&locks.owner("w"), LEASE).await,
        "free for a writer",
    );
    write.unlock().await.unwrap();
}

#[tokio::test]
async fn a_waiting_writer_wakes_when_the_readers_leave() {
    let (locks, lock) = new_catalog();
    let reader = held(
        lock.try_read(&locks.owner("r"), LEASE).await,
        "the lock is free",
    );
    let writer = locks.spawn_as("w", &lock, |lock, owner| async move {
        lock.write(&owner, LEASE, LEASE).await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    reader.unlock().await.unwrap();
    let write = writer.await.unwrap().expect("the writer got the lock");
    assert!(
        released.elapsed() < LEASE / 2,
        "the writer slept out the reader's lease"
    );
    assert_eq!(lock.mode().await.unwrap(), Some(Hold::Write));
    write.unlock().await.unwrap();
}

#[tokio::test]
async fn the_watchdog_keeps_read_and_write_holds_alive_and_reports_a_lost_one() {
    let locks = TestLocks::with_watchdog();
    let lock = locks.read_write_lock("catalog");
    let reader = held(
        lock.try_read(&locks.owner("r"), Lease::Watchdog).await,
        "the lock is free",
    );
    tokio::time::sleep(SHORT_WATCHDOG_LEASE * 3).await;
    assert!(!reader.is_lost());
    assert_eq!(
        lock.mode().await.unwrap(),
        Some(Hold::Read),
        "the read hold expired despite the watchdog"
    );
    refused(
        lock.try_write(&locks.owner("w"), LEASE).await,
        "the lock is held",
    );
    reader.unlock().await.unwrap();
    assert_eq!(locks.watched_locks(), 0);

    let writer = held(
        lock.try_write(&locks.owner("w"), Lease::Watchdog).await,
        "the lock is free",
    );
    tokio::time::sleep(SHORT_WATCHDOG_LEASE * 2).await;
    assert_eq!(lock.mode().await.unwrap(), Some(Hold::Write));
    delete_behind_its_back(&redis_url(), lock.key()).await;
    tokio::time::timeout(Duration::from_secs(10), writer.lost())
        .await
        .expect("the writer heard its lock was lost");
}

#[tokio::test]
async fn a_writer_giving_back_a_short_nested_hold_keeps_the_long_lease_of_the_other() {
    let (locks, lock) = new_catalog();
    let w = locks.owner("w");
    let long = Lease::Fixed(Duration::from_secs(60));
    let outer = held(lock.try_write(&w, long).await, "a free lock writes");
    let inner = held(
        lock.try_write(&w, Lease::Fixed(Duration::from_secs(1)))
            .await,
        "the writer reenters",
    );
    assert_eq!(inner.unlock().await.unwrap(), 1);
    let ttl = crate::support::pttl(lock.key()).await;
    // Cut to the nested hold's 1 s before: another writer got in 1 s later.
    assert!(ttl > 30_000, "the outer hold's lease was cut to {ttl} ms");
    assert_eq!(outer.unlock().await.unwrap(), 0);
}

#[tokio::test]
async fn a_reader_giving_back_one_hold_ends_that_holds_lease_and_no_other() {
    let (locks, lock) = new_catalog();
    let (reader, writer) = (locks.owner("r"), locks.owner("w"));
    let short = held(
        lock.try_read(&reader, Lease::Fixed(Duration::from_millis(200)))
            .await,
        "a free lock reads",
    );
    let long = held(
        lock.try_read(&reader, Lease::Fixed(Duration::from_secs(60)))
            .await,
        "the reader reenters",
    );
    // The long hold goes back first: the short one is left, and when its
    // lease runs out the lock is free.
    assert_eq!(long.unlock().await.unwrap(), 1);
    let long = held(
        lock.try_read(&reader, Lease::Fixed(Duration::from_secs(60)))
            .await,
        "the reader reenters again",
    );
    // The short hold goes back early: the long one still holds the lock.
    // (The numbered lease keys of before deleted the newest hold's key, the
    // long one's, and the lock expired with the short lease under it.)
    assert_eq!(short.unlock().await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    refused(
        lock.try_write(&writer, LEASE).await,
        "a writer got in beside a live reader",
    );
    assert_eq!(lock.mode().await.unwrap(), Some(Hold::Read));
    assert_eq!(long.unlock().await.unwrap(), 0);
    assert_eq!(lock.mode().await.unwrap(), None);
}

#[tokio::test]
async fn a_read_hold_whose_lease_ran_out_is_not_given_back_for_another() {
    let (locks, lock) = new_catalog();
    let reader = locks.owner("r");
    let stale = held(
        lock.try_read(&reader, Lease::Fixed(Duration::from_millis(100)))
            .await,
        "a free lock reads",
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let live = held(lock.try_read(&reader, LEASE).await, "free again");
    assert!(
        stale.unlock().await.is_err(),
        "a hold whose lease ran out was given back"
    );
    assert_eq!(lock.mode().await.unwrap(), Some(Hold::Read));
    refused(
        lock.try_write(&locks.owner("w"), LEASE).await,
        "the stale guard gave back the live hold",
    );
    assert_eq!(live.unlock().await.unwrap(), 0);
    assert_eq!(lock.mode().await.unwrap(), None);
}
