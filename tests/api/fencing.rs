//! Fencing tokens end to end: a lock holder that stalls past its lease
//! cannot write after the next holder did.

use std::time::Duration;

use redis_locks::{Acquired, Lock, LockClient, LockGuard};
use reqwest::StatusCode;
use seckill::domain::{FencingToken, OrderId, Quantity, UserId, VoucherId};
use seckill::id::IdGenerator;
use seckill::kv::Kv;
use seckill::store::{Sale, SaleRequest, Store};

use crate::helpers::{buy, redis_url, spawn_app, TestApp};

/// `name` takes `lock`, which must be free (or its lease run out), for
/// `lease`.
async fn take(locks: &LockClient, lock: &Lock, name: &str, lease: Duration) -> LockGuard {
    match lock.try_acquire(&locks.owner(name), lease).await.unwrap() {
        Acquired::Yes(guard) => guard,
        Acquired::HeldByOther { .. } => panic!("{name} did not get the lock"),
    }
}

/// The service's own store, id counter and lock client for `app`, and the
/// lock of `user`'s purchases of `voucher`: what a purchase holds, taken
/// by hand so that a test can stall it.
struct Holders {
    store: Store,
    ids: IdGenerator,
    locks: LockClient,
    lock: Lock,
    user: i64,
}

impl Holders {
    async fn of(app: &TestApp, voucher: i64, user: i64) -> Self {
        let client = redis::Client::open(redis_url()).unwrap();
        let keyspace = app.keyspace().await;
        let ids = IdGenerator::new(
            Kv::new(client.clone(), Duration::from_secs(5)),
            keyspace.clone(),
        );
        let locks = LockClient::new(client, keyspace);
        let (name, _) = seckill::seckill::lock_of(
            VoucherId::new(voucher).unwrap(),
            UserId::new(user).unwrap(),
            0,
        );
        let lock = locks.lock(&name);
        Self {
            store: Store::from_pool(app.db.clone(), Duration::from_secs(5)),
            ids,
            locks,
            lock,
            user,
        }
    }

    /// `name` takes the lock, which must be free (or its lease run out).
    async fn take(&self, name: &str, lease: Duration) -> LockGuard {
        take(&self.locks, &self.lock, name, lease).await
    }

    /// Sells the user one unit of `target` in a batch of one, behind
    /// `fence`: the new order's id and the statement's answer.
    async fn sell(&self, target: i64, fence: i64) -> (OrderId, Sale) {
        let order_id = self.ids.next_id().await.unwrap();
        let request = SaleRequest {
            order_id,
            user_id: UserId::new(self.user).unwrap(),
            fence: Some(FencingToken::new(fence)),
            at: chrono::Utc::now(),
            quantity: Quantity::ONE,
        };
        let target = VoucherId::new(target).unwrap();
        let sold = self.store.sell_batch(target, 3, &[request]).await.unwrap();
        (order_id, sold.sales[0])
    }
}

#[tokio::test]
async fn a_stalled_holder_is_refused_after_the_next_holder_bought() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(5).await;
    let other_voucher = app.open_voucher(5).await;
    // The service's own lock for this user and voucher.
    let h = Holders::of(&app, voucher, 42).await;

    // A takes the user's lock with a short lease, checks, and stalls.
    let a = h.take("A", Duration::from_millis(100)).await;
    let held: Option<i64> =
        sqlx::query_scalar("SELECT id FROM voucher_orders WHERE user_id = $1 AND voucher_id = $2")
            .bind(h.user)
            .bind(voucher)
            .fetch_optional(&app.db)
            .await
            .unwrap();
    assert!(held.is_none(), "A checks: no order yet");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(a.is_lost(), "A's lease ran out while it stalled");

    // B takes the lock (A's lease ran out) and buys.
    let b = h.take("B", Duration::from_secs(10)).await;
    assert!(b.fence() > a.fence());
    assert_eq!(h.sell(voucher, b.fence()).await.1, Sale::Sold);

    // A resumes: its write is refused. (Its token is of the lock of this
    // voucher: it speaks for no other.)
    assert_eq!(
        h.sell(voucher, a.fence()).await.1,
        Sale::Fenced,
        "A's stale write"
    );
    b.unlock().await.unwrap();

    assert_eq!(app.check_invariants(voucher).await, 1);
    assert_eq!(app.check_invariants(other_voucher).await, 0);
    // The user's next purchase, under a new lock, goes through.
    let token = app.token(h.user).await;
    let (status, answer) = buy(&app.client, &app.base, &token, other_voucher).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

/// What the fence adds beyond the unique index: a stalled holder's write
/// that would no longer collide with anything (the next holder's order was
/// cancelled, so the user holds no live order) is still refused. Without
/// the fence it would sell the user a unit they gave back.
#[tokio::test]
async fn a_stalled_holder_is_refused_even_after_the_next_holders_order_was_cancelled() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(5).await;
    let h = Holders::of(&app, voucher, 43).await;

    // A takes the lock and stalls past its lease; B takes it and buys.
    let a = h.take("A", Duration::from_millis(100)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(a.is_lost(), "A's lease ran out while it stalled");
    let b = h.take("B", Duration::from_secs(10)).await;
    let (b_order, sold) = h.sell(voucher, b.fence()).await;
    assert_eq!(sold, Sale::Sold);
    b.unlock().await.unwrap();

    // The user cancels B's order: the unit goes back, and no live order
    // of theirs is left for a stale write to collide with.
    let token = app.token(h.user).await;
    let (status, body) = app
        .post_as(&format!("/orders/{b_order}/cancel"), &token)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(app.check_invariants(voucher).await, 0);

    // A resumes: the unique index would let it sell; the fence does not.
    let (_, stale) = h.sell(voucher, a.fence()).await;
    assert_eq!(stale, Sale::Fenced, "A's stale write after the cancel");
    assert_eq!(app.check_invariants(voucher).await, 0);

    // The user's own next purchase, under a new lock, goes through.
    let (status, answer) = buy(&app.client, &app.base, &token, voucher).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(app.check_invariants(voucher).await, 1);
}

/// A Redis failover that lost the user's fencing-token key, onto a master
/// whose clock is behind: the tokens Postgres holds for the user are ahead
/// of any the new master hands out. Shown here by writing the stored token
/// ahead of Redis's clock (as the old master's would be). The user's next
/// purchase is refused as a stale holder's, `429 purchase_in_progress`,
/// and nothing is sold twice: the weakness the guide's failure matrix
/// names ("a user's newest attempt wins" may not hold across such a
/// failover), not a loss of one live order per user.
#[tokio::test]
async fn a_stored_token_ahead_of_redis_clock_refuses_the_users_next_purchase() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(5).await;
    let token = app.token(44).await;
    let ahead_us = (chrono::Utc::now().timestamp_micros()) + 3_600_000_000;
    store_fence(&app, 44, voucher, ahead_us).await;
    let (status, answer) = buy(&app.client, &app.base, &token, voucher).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
    assert!(answer.contains("purchase_in_progress"), "{answer}");
    assert_eq!(app.check_invariants(voucher).await, 0);

    // Once Redis's tokens pass the stored one (here: the stored one moved
    // back, as the new master's clock catching up would), the user buys.
    store_fence(&app, 44, voucher, 1).await;
    let (status, answer) = buy(&app.client, &app.base, &token, voucher).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(app.check_invariants(voucher).await, 1);
}

/// Writes the token Postgres holds for `user_id` and `voucher`, as a
/// holder's sale would have.
async fn store_fence(app: &TestApp, user_id: i64, voucher: i64, token: i64) {
    sqlx::query(
        "INSERT INTO user_fences (user_id, voucher_id, token) VALUES ($1, $2, $3)
         ON CONFLICT (user_id, voucher_id) DO UPDATE SET token = EXCLUDED.token",
    )
    .bind(user_id)
    .bind(voucher)
    .bind(token)
    .execute(&app.db)
    .await
    .unwrap();
}
