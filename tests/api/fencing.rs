//! Fencing tokens end to end: a lock holder that stalls past its lease
//! cannot write after the next holder did.

use std::time::Duration;

use redis_locks::{Acquired, Lock, LockClient, LockGuard};
use reqwest::StatusCode;
use seckill::id::IdGenerator;
use seckill::kv::Kv;
use seckill::store::{Sale, SaleRequest, Store};

use crate::helpers::{buy, redis_url, spawn_app};

/// `name` takes `lock`, which must be free (or its lease run out), for
/// `lease`.
async fn take(locks: &LockClient, lock: &Lock, name: &str, lease: Duration) -> LockGuard {
    match lock.try_acquire(&locks.owner(name), lease).await.unwrap() {
        Acquired::Yes(guard) => guard,
        Acquired::HeldByOther { .. } => panic!("{name} did not get the lock"),
    }
}

#[tokio::test]
async fn a_stalled_holder_is_refused_after_the_next_holder_bought() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(5).await;
    let other_voucher = app.open_voucher(5).await;
    let user = 42;
    let store = Store::from_pool(app.db.clone(), Duration::from_secs(5));
    let client = redis::Client::open(redis_url()).unwrap();
    let keyspace = app.keyspace().await;
    let ids = IdGenerator::new(
        Kv::new(client.clone(), Duration::from_secs(5)),
        keyspace.clone(),
    );
    let locks = LockClient::new(client, keyspace);
    // The service's own lock for this user and voucher.
    let (name, _) = seckill::seckill::lock_of(voucher, user, 0);
    let lock = locks.lock(&name);

    // A takes the user's lock with a short lease, checks, and stalls.
    let a = take(&locks, &lock, "A", Duration::from_millis(100)).await;
    let held: Option<i64> =
        sqlx::query_scalar("SELECT id FROM voucher_orders WHERE user_id = $1 AND voucher_id = $2")
            .bind(user)
            .bind(voucher)
            .fetch_optional(&app.db)
            .await
            .unwrap();
    assert!(held.is_none(), "A checks: no order yet");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(a.is_lost(), "A's lease ran out while it stalled");

    // B takes the lock (A's lease ran out) and buys.
    let b = take(&locks, &lock, "B", Duration::from_secs(10)).await;
    assert!(b.fence() > a.fence());
    let sell = |target: i64, fence: i64| {
        let (store, ids) = (&store, &ids);
        async move {
            let order_id = ids.next_id().await.unwrap().as_i64();
            let request = SaleRequest {
                order_id,
                user_id: user,
                fence: Some(fence),
                at: chrono::Utc::now(),
            };
            store.sell_batch(target, 3, &[request]).await.unwrap().sales[0]
        }
    };
    assert_eq!(sell(voucher, b.fence()).await, Sale::Sold);

    // A resumes: its write is refused. (Its token is of the lock of this
    // voucher: it speaks for no other.)
    assert_eq!(
        sell(voucher, a.fence()).await,
        Sale::Fenced,
        "A's stale write"
    );
    b.unlock().await.unwrap();

    assert_eq!(app.check_invariants(voucher).await, 1);
    assert_eq!(app.check_invariants(other_voucher).await, 0);
    // The user's next purchase, under a new lock, goes through.
    let token = app.token(user).await;
    let (status, answer) = buy(&app.client, &app.base, &token, other_voucher).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}
