//! The one subscriber connection a lock client's waiters share (the command
//! connection cannot SUBSCRIBE), with a reference count per channel and a
//! counter that every message bumps, so that a release between a waiter's
//! last attempt and its wait is not missed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use tokio::sync::{watch, OnceCell};

pub(super) struct Subscriber {
    client: super::Endpoint,
    /// Every channel someone waits on, by name.
    channels: Mutex<HashMap<String, Channel>>,
    /// Sent under this lock, SUBSCRIBE and UNSUBSCRIBE keep their order.
    sink: tokio::sync::Mutex<Option<PubSubSink>>,
    ids: AtomicU64,
}

struct Channel {
    id: u64,
    refs: usize,
    /// Bumped by every message; closed when the connection is lost.
    signal: watch::Sender<u64>,
    /// Set once Redis has confirmed the SUBSCRIBE.
    subscribed: Arc<OnceCell<()>>,
}

/// Why a wait ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Woken {
    /// A message arrived on the channel.
    Message,
    /// The time given ran out.
    Timeout,
    /// The subscription was lost with its connection: subscribe again.
    Lost,
}

/// One waiter's hold on a channel; dropping it releases the reference.
pub(super) struct Subscription {
    subscriber: Arc<Subscriber>,
    channel: String,
    id: u64,
    signal: watch::Receiver<u64>,
}

impl Subscriber {
    pub(super) fn new(client: super::Endpoint) -> Arc<Self> {
        Arc::new(Self {
            client,
            channels: Mutex::new(HashMap::new()),
            sink: tokio::sync::Mutex::new(None),
            ids: AtomicU64::new(0),
        })
    }

    /// Subscribes to `channel` (or joins its waiters), returning once Redis
    /// has confirmed.
    pub(super) async fn subscribe(
        self: &Arc<Self>,
        channel: &str,
    ) -> redis::RedisResult<Subscription> {
        let (id, signal, subscribed) = {
            let mut channels = self.channels.lock().expect("channel map poisoned");
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    id: self.ids.fetch_add(1, Ordering::Relaxed),
                    refs: 0,
                    signal: watch::Sender::new(0),
                    subscribed: Arc::new(OnceCell::new()),
                });
            entry.refs += 1;
            (entry.id, entry.signal.subscribe(), entry.subscribed.clone())
        };
        let subscription = Subscription {
            subscriber: self.clone(),
            channel: channel.to_owned(),
            id,
            signal,
        };
        subscribed
            .get_or_try_init(|| async {
                let mut sink = self.sink.lock().await;
                let sink = self.connected(&mut sink).await?;
                sink.subscribe(channel).await
            })
            .await?;
        Ok(subscription)
    }

    /// The live sink, connecting (and starting the reader) if there is none.
    async fn connected<'a>(
        self: &Arc<Self>,
        slot: &'a mut Option<PubSubSink>,
    ) -> redis::RedisResult<&'a mut PubSubSink> {
        if slot.is_none() {
            let (sink, mut stream) = self
                .client
                .subscriber_client()
                .await?
                .get_async_pubsub()
                .await?
                .split();
            let me = Arc::downgrade(self);
            tokio::spawn(async move {
                while let Some(message) = stream.next().await {
                    let Some(me) = me.upgrade() else { return };
                    let channels = me.channels.lock().expect("channel map poisoned");
                    if let Some(entry) = channels.get(message.get_channel_name()) {
                        entry.signal.send_modify(|n| *n += 1);
                    }
                }
                // The connection is gone: its waiters subscribe again.
                if let Some(me) = me.upgrade() {
                    me.channels.lock().expect("channel map poisoned").clear();
                    *me.sink.lock().await = None;
                }
            });
            *slot = Some(sink);
        }
        Ok(slot.as_mut().expect("just connected"))
    }

    fn release(self: &Arc<Self>, channel: &str, id: u64) {
        let last = {
            let mut channels = self.channels.lock().expect("channel map poisoned");
            match channels.get_mut(channel) {
                Some(entry) if entry.id == id => {
                    entry.refs -= 1;
                    if entry.refs == 0 {
                        channels.remove(channel);
                        true
                    } else {
                        false
                    }
                }
                // Lost with a connection already, or a newer subscription.
                _ => false,
            }
        };
        if !last {
            return;
        }
        let (me, channel) = (self.clone(), channel.to_owned());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let mut sink = me.sink.lock().await;
                // A new waiter may have come for the channel meanwhile; its
                // SUBSCRIBE went first, so this UNSUBSCRIBE must not follow.
                if me
                    .channels
                    .lock()
                    .expect("channel map poisoned")
                    .contains_key(&channel)
                {
                    return;
                }
                if let Some(sink) = sink.as_mut() {
                    let _ = sink.unsubscribe(&channel).await;
                }
            });
        }
    }

    /// Channels with at least one waiter (for tests and metrics).
    pub(super) fn active_channels(&self) -> usize {
        self.channels.lock().expect("channel map poisoned").len()
    }
}

impl Subscription {
    /// Marks every message so far as seen.
    pub(super) fn mark_seen(&mut self) {
        self.signal.borrow_and_update();
    }

    /// Waits for a message newer than the last `mark_seen`, at most `max`.
    pub(super) async fn wait(&mut self, max: Duration) -> Woken {
        match tokio::time::timeout(max, self.signal.changed()).await {
            Ok(Ok(())) => Woken::Message,
            Ok(Err(_)) => Woken::Lost,
            Err(_) => Woken::Timeout,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.subscriber.release(&self.channel, self.id);
    }
}
