//! The reentrant lock against real Redis.

use std::time::Duration;

use deadpool_redis::redis;
use seckill::lock::{Acquired, LockClient, LockError, LockGuard, Released};
use uuid::Uuid;

use crate::helpers::{delete_keys, redis_url};

const LEASE: Duration = Duration::from_secs(10);

fn client() -> (LockClient, String) {
    let pool = deadpool_redis::Config::from_url(redis_url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let prefix = format!("test:{}:", Uuid::new_v4().simple());
    (LockClient::new(pool, prefix.clone()), prefix)
}

#[track_caller]
fn acquired(result: Result<Acquired, LockError>) -> LockGuard {
    match result {
        Ok(Acquired::Yes(guard)) => guard,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

async fn raw_hash(key: &str) -> Vec<(String, String)> {
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
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
    let (locks, prefix) = client();
    let lock = locks.lock("order:1");
    let owner = locks.owner("request-1");

    let outer = acquired(lock.try_acquire(&owner, LEASE).await);
    let inner = acquired(lock.try_acquire(&owner, LEASE).await);
    assert_eq!(lock.hold_count(&owner).await.unwrap(), 2);
    assert_eq!(
        raw_hash(lock.key()).await,
        vec![(owner.to_string(), "2".to_owned())]
    );
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
    acquired(lock.try_acquire(&other, LEASE).await)
        .unlock()
        .await
        .unwrap();
    delete_keys(&redis_url(), &prefix).await;
}

#[tokio::test]
async fn a_release_by_someone_else_changes_nothing_and_is_reported() {
    let (locks, prefix) = client();
    let lock = locks.lock("order:2");
    let owner = locks.owner("holder");
    let guard = acquired(lock.try_acquire(&owner, LEASE).await);
    let before = raw_hash(lock.key()).await;

    // Another owner in this process, and the same id in another process.
    let strangers = [locks.owner("stranger"), client().0.owner("holder")];
    for stranger in &strangers {
        match lock.release(stranger, LEASE).await {
            Err(LockError::NotHeld { .. }) => {}
            other => panic!("a stranger's release returned {other:?}"),
        }
    }
    assert_eq!(raw_hash(lock.key()).await, before);
    assert_eq!(lock.hold_count(&owner).await.unwrap(), 1);
    guard.unlock().await.unwrap();
    delete_keys(&redis_url(), &prefix).await;
}

#[tokio::test]
async fn an_expired_lease_frees_the_lock_and_the_late_release_is_reported() {
    let (locks, prefix) = client();
    let lock = locks.lock("order:3");
    let slow = locks.owner("slow");
    let guard = acquired(lock.try_acquire(&slow, Duration::from_millis(100)).await);
    tokio::time::sleep(Duration::from_millis(250)).await;

    let next = locks.owner("next");
    let next_guard = acquired(lock.try_acquire(&next, LEASE).await);
    assert!(matches!(
        guard.unlock().await,
        Err(LockError::NotHeld { .. })
    ));
    // The late release did not touch the new holder's lock.
    assert_eq!(lock.hold_count(&next).await.unwrap(), 1);
    next_guard.unlock().await.unwrap();
    delete_keys(&redis_url(), &prefix).await;
}

#[tokio::test]
async fn a_dropped_guard_releases_and_shutdown_waits_for_it() {
    let (locks, prefix) = client();
    let lock = locks.lock("order:4");
    let owner = locks.owner("dropped");
    drop(acquired(lock.try_acquire(&owner, LEASE).await));
    assert!(
        locks.shutdown(Duration::from_secs(5)).await,
        "the release finished"
    );
    assert!(!lock.is_locked().await.unwrap());
    delete_keys(&redis_url(), &prefix).await;
}
