//! A stream read by a consumer group: the calls every stream writer makes
//! (the async sale's and the lab's), each with the pool's deadline.

use std::sync::LazyLock;
use std::time::Duration;

use redis::streams::{StreamAutoClaimReply, StreamId, StreamInfoConsumersReply, StreamReadReply};
use redis::{self, Script};

use super::{Kv, KvError};

/// One consumer of one group on one stream.
#[derive(Debug, Clone, Copy)]
pub struct Consumer<'a> {
    pub stream: &'a str,
    pub group: &'a str,
    pub name: &'a str,
}

/// `lua/stream_prune_consumer.lua`, hashed once.
static PRUNE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/stream_prune_consumer.lua")));

/// `lua/stream_ack.lua`, hashed once.
static ACK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/stream_ack.lua")));

/// A consumer of a group, as `XINFO CONSUMERS` shows it.
#[derive(Debug, Clone)]
pub struct ConsumerState {
    pub name: String,
    /// Entries delivered to it and not acknowledged.
    pub pending: usize,
    /// Since it last read (Redis 7.2 and later: last tried to).
    pub idle: Duration,
}

/// Which entries [`Kv::read_group`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Entries never delivered to anyone in the group (`>`).
    New,
    /// Entries delivered to this consumer and not acknowledged (`0`): a
    /// batch it failed to finish, tried again.
    Own,
}

impl Kv {
    /// Creates `group` on `stream` from its first entry (and the stream, if
    /// missing), unless the group exists.
    pub async fn create_group(&self, stream: &str, group: &str) -> Result<(), KvError> {
        let mut create = redis::cmd("XGROUP");
        create
            .arg("CREATE")
            .arg(stream)
            .arg(group)
            .arg("0")
            .arg("MKSTREAM");
        match self.query::<()>(&create).await {
            Err(error) if error.code() == Some("BUSYGROUP") => Ok(()),
            other => other,
        }
    }

    /// Up to `count` entries for `consumer`, as `delivery` says.
    pub async fn read_group(
        &self,
        consumer: Consumer<'_>,
        delivery: Delivery,
        count: usize,
    ) -> Result<Vec<StreamId>, KvError> {
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP")
            .arg(consumer.group)
            .arg(consumer.name)
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(consumer.stream)
            .arg(match delivery {
                Delivery::New => ">",
                Delivery::Own => "0",
            });
        let reply: Option<StreamReadReply> = self.query(&read).await?;
        Ok(reply
            .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
            .unwrap_or_default())
    }

    /// Takes over up to `count` entries left unacknowledged with other
    /// consumers for at least `min_idle` (Redis 6.2's `XAUTOCLAIM`).
    pub async fn claim_idle(
        &self,
        consumer: Consumer<'_>,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<StreamId>, KvError> {
        let mut claim = redis::cmd("XAUTOCLAIM");
        claim
            .arg(consumer.stream)
            .arg(consumer.group)
            .arg(consumer.name)
            .arg(u64::try_from(min_idle.as_millis()).unwrap_or(u64::MAX))
            .arg("0-0")
            .arg("COUNT")
            .arg(count);
        let reply: StreamAutoClaimReply = self.query(&claim).await?;
        Ok(reply.claimed)
    }

    /// How many entries `stream` holds, read or not (0 if it is missing).
    pub async fn stream_len(&self, stream: &str) -> Result<u64, KvError> {
        self.query(redis::cmd("XLEN").arg(stream)).await
    }

    /// Acknowledges `ids` in `group` and removes them from `stream`, in one
    /// step (`lua/stream_ack.lua`: the stream keeps only the entries not
    /// acknowledged).
    pub async fn ack_and_delete(
        &self,
        stream: &str,
        group: &str,
        ids: &[&str],
    ) -> Result<(), KvError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.invoke::<i64>(ACK.key(stream).arg(group).arg(ids))
            .await
            .map(drop)
    }

    /// The consumers of `group` on `stream`.
    pub async fn consumers(
        &self,
        stream: &str,
        group: &str,
    ) -> Result<Vec<ConsumerState>, KvError> {
        let info: StreamInfoConsumersReply = self
            .query(redis::cmd("XINFO").arg("CONSUMERS").arg(stream).arg(group))
            .await?;
        Ok(info
            .consumers
            .into_iter()
            .map(|c| ConsumerState {
                name: c.name,
                pending: c.pending,
                idle: Duration::from_millis(u64::try_from(c.idle).unwrap_or(0)),
            })
            .collect())
    }

    /// Removes `name` from `group` unless it holds entries (checked in the
    /// same step); whether it is gone.
    pub async fn prune_consumer(
        &self,
        stream: &str,
        group: &str,
        name: &str,
    ) -> Result<bool, KvError> {
        let removed: i64 = self.invoke(PRUNE.key(stream).arg(group).arg(name)).await?;
        Ok(removed == 1)
    }
}
