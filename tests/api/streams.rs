//! The stream a consumer group writes from, against real Redis: once
//! acknowledged, an entry is gone from the stream, whatever order the
//! group's consumers acknowledge in, and nothing unacknowledged is.

use std::collections::BTreeSet;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::streams::StreamRangeReply;
use seckill::kv::{Consumer, Delivery, Kv};
use uuid::Uuid;

use crate::helpers::{delete_keys, redis_conn, redis_url};

const GROUP: &str = "writers";

struct Stream {
    prefix: String,
    key: String,
    kv: Kv,
    conn: MultiplexedConnection,
}

impl Stream {
    async fn new() -> Self {
        let prefix = format!("test:{}:", Uuid::new_v4().simple());
        let kv = Kv::new(
            redis::Client::open(redis_url()).unwrap(),
            Duration::from_secs(5),
        );
        let key = format!("{prefix}orders");
        kv.create_group(&key, GROUP).await.unwrap();
        Self {
            key,
            prefix,
            kv,
            conn: redis_conn(&redis_url()).await,
        }
    }

    async fn append(&mut self, n: usize) {
        for i in 0..n {
            redis::cmd("XADD")
                .arg(&self.key)
                .arg("*")
                .arg("order")
                .arg(i)
                .query_async::<String>(&mut self.conn)
                .await
                .unwrap();
        }
    }

    async fn read(&self, consumer: &str, count: usize) -> Vec<String> {
        let consumer = Consumer {
            stream: &self.key,
            group: GROUP,
            name: consumer,
        };
        self.kv
            .read_group(consumer, Delivery::New, count)
            .await
            .unwrap()
            .into_iter()
            .map(|entry| entry.id)
            .collect()
    }

    async fn ack(&self, ids: &[String]) {
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        self.kv
            .ack_and_delete(&self.key, GROUP, &ids)
            .await
            .unwrap();
    }

    async fn held(&mut self) -> BTreeSet<String> {
        let range: StreamRangeReply = redis::cmd("XRANGE")
            .arg(&self.key)
            .arg("-")
            .arg("+")
            .query_async(&mut self.conn)
            .await
            .unwrap();
        range.ids.into_iter().map(|entry| entry.id).collect()
    }
}

#[tokio::test]
async fn a_consumers_acknowledged_entries_leave_the_stream_and_the_rest_stay() {
    let mut stream = Stream::new().await;
    stream.append(10).await;
    let first = stream.read("a", 4).await;
    stream.ack(&first).await;
    assert_eq!(stream.held().await.len(), 6, "the six never read stay");
    let rest = stream.read("a", 10).await;
    stream.ack(&rest).await;
    assert!(stream.held().await.is_empty());
    delete_keys(&redis_url(), &stream.prefix).await;
}

#[tokio::test]
async fn entries_acknowledged_behind_another_consumers_pending_ones_leave_the_stream_too() {
    let mut stream = Stream::new().await;
    stream.append(12).await;
    let all = stream.held().await;
    let a = stream.read("a", 5).await;
    let b = stream.read("b", 5).await;
    // b finishes first: its entries go, a's stay pending, the last two
    // were never read.
    stream.ack(&b).await;
    let expected: BTreeSet<String> = all.iter().filter(|id| !b.contains(id)).cloned().collect();
    assert_eq!(stream.held().await, expected);
    // a acknowledges part of its batch.
    stream.ack(&a[..3]).await;
    let expected: BTreeSet<String> = expected
        .into_iter()
        .filter(|id| !a[..3].contains(id))
        .collect();
    assert_eq!(stream.held().await, expected);
    stream.ack(&a[3..]).await;
    // (Ids as strings sort "…-10" before "…-9": the unread are told by
    // what was read, not by their place in the set.)
    let unread: BTreeSet<String> = all
        .iter()
        .filter(|id| !a.contains(id) && !b.contains(id))
        .cloned()
        .collect();
    assert_eq!(unread.len(), 2);
    assert_eq!(stream.held().await, unread);
    delete_keys(&redis_url(), &stream.prefix).await;
}

#[tokio::test]
async fn under_any_order_of_reads_and_acknowledgements_the_stream_holds_exactly_the_unacknowledged()
{
    let mut stream = Stream::new().await;
    // A fixed pseudo-random schedule (an LCG), so that a failure repeats.
    let mut seed: u64 = 0x5eed_cafe;
    let mut next = move |bound: usize| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((seed >> 33) as usize) % bound
    };
    let consumers = ["a", "b", "c"];
    let mut pending: Vec<Vec<String>> = vec![Vec::new(); consumers.len()];
    let mut acknowledged = BTreeSet::new();
    let mut appended = BTreeSet::new();
    for step in 0..300 {
        match next(3) {
            0 => {
                let before = stream.held().await;
                stream.append(1 + next(4)).await;
                let after = stream.held().await;
                appended.extend(after.difference(&before).cloned());
            }
            1 => {
                let who = next(consumers.len());
                let read = stream.read(consumers[who], 1 + next(5)).await;
                pending[who].extend(read);
            }
            _ => {
                let who = next(consumers.len());
                if pending[who].is_empty() {
                    continue;
                }
                // Any part of what it holds, in any order: a consumer
                // writes part of a batch, or its entries out of order.
                let mut batch = Vec::new();
                for _ in 0..=next(4) {
                    if pending[who].is_empty() {
                        break;
                    }
                    let at = next(pending[who].len());
                    batch.push(pending[who].remove(at));
                }
                stream.ack(&batch).await;
                acknowledged.extend(batch);
            }
        }
        let expected: BTreeSet<String> = appended.difference(&acknowledged).cloned().collect();
        assert_eq!(stream.held().await, expected, "after step {step}");
    }
    for rest in pending {
        stream.ack(&rest).await;
    }
    let unread = stream.read("a", 10_000).await;
    stream.ack(&unread).await;
    assert!(stream.held().await.is_empty());
    delete_keys(&redis_url(), &stream.prefix).await;
}
