//! The order-id generator against real Redis.

use std::collections::HashSet;

use chrono::Utc;
use seckill::domain::EPOCH_UNIX;
use seckill::id::{IdError, IdGenerator};
use seckill::kv::Kv;
use uuid::Uuid;

use crate::helpers::{delete_keys, redis_url};

struct Prefixed {
    prefix: String,
    client: redis::Client,
}

impl Prefixed {
    fn new() -> Self {
        Self {
            prefix: format!("test:{}:", Uuid::new_v4().simple()),
            client: redis::Client::open(redis_url()).unwrap(),
        }
    }

    fn generator(&self) -> IdGenerator {
        IdGenerator::new(
            Kv::new(self.client.clone(), std::time::Duration::from_secs(5)),
            self.prefix.clone(),
        )
    }

    async fn redis_time(&self) -> i64 {
        let mut conn = self
            .client
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let (secs, _micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
        secs
    }

    async fn cleanup(self) {
        delete_keys(&redis_url(), &self.prefix).await;
    }
}

#[tokio::test]
async fn ids_have_the_documented_layout_and_a_per_day_key() {
    let redis = Prefixed::new();
    let ids = redis.generator();
    let before = redis.redis_time().await;
    let first = ids.next_id().await.unwrap();
    let second = ids.next_id().await.unwrap();
    let after = redis.redis_time().await;

    assert!(first.get() > 0, "the sign bit is clear");
    assert_eq!(first.get() >> 32, first.seconds_since_epoch());
    let stamped = first.seconds_since_epoch() + EPOCH_UNIX;
    assert!(
        (before..=after).contains(&stamped),
        "{stamped} not in [{before}, {after}]"
    );
    assert_eq!(
        (first.sequence(), second.sequence()),
        (1, 2),
        "a fresh day key counts from 1"
    );
    assert!(second > first);

    let key = format!(
        "{}icr:order:{}",
        redis.prefix,
        Utc::now().format("%Y:%m:%d")
    );
    assert_eq!(ids.day_key(Utc::now()), key);
    let mut conn = redis
        .client
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (count, ttl): (u64, i64) = redis::pipe()
        .cmd("GET")
        .arg(&key)
        .cmd("TTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(count, 2);
    assert!(ttl > 86_400, "the day key outlives its day, ttl {ttl}");
    drop(conn);
    redis.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_unique_and_monotonic_under_concurrency() {
    let redis = Prefixed::new();
    let ids = redis.generator();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let ids = ids.clone();
            tokio::spawn(async move {
                let mut drawn = Vec::new();
                for _ in 0..200 {
                    drawn.push(ids.next_id().await.unwrap());
                }
                drawn
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        let drawn = task.await.unwrap();
        // Each caller sees its ids grow.
        assert!(drawn.windows(2).all(|w| w[0] < w[1]));
        all.extend(drawn);
    }
    assert_eq!(all.iter().collect::<HashSet<_>>().len(), 1600, "ids repeat");
    // Across callers, the order Redis counted in is the order of the ids:
    // sorted by counter, the ids are sorted too.
    all.sort_by_key(|id| id.sequence());
    let sequences: Vec<u32> = all.iter().map(|id| id.sequence()).collect();
    assert_eq!(sequences, (1..=1600).collect::<Vec<_>>());
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "ids not monotonic in counter order"
    );
    redis.cleanup().await;
}

#[tokio::test]
async fn an_exhausted_day_counter_is_an_error_not_a_wrap() {
    let redis = Prefixed::new();
    let ids = redis.generator();
    let key = ids.day_key(Utc::now());
    let mut conn = redis
        .client
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("SET")
        .arg(&key)
        .arg(u64::from(u32::MAX) - 1)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();

    let last = ids.next_id().await.unwrap();
    assert_eq!(last.sequence(), u32::MAX);
    for _ in 0..2 {
        assert!(matches!(
            ids.next_id().await,
            Err(IdError::Exhausted { .. })
        ));
    }
    drop(conn);
    redis.cleanup().await;
}
