//! The one subscriber connection a lock client's waiters share (the command
//! connection cannot SUBSCRIBE), with a reference count per channel and a
//! counter that every message bumps, so that a release between a waiter's
//! last attempt and its wait is not missed. Subscribing has the client's
//! command deadline: a subscriber connection that does not confirm in time
//! is dropped, and its waiters subscribe again on a new one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::PubSubSink;
use tokio::sync::{oneshot, watch, OnceCell};

pub(super) struct Subscriber {
    client: super::Endpoint,
    /// How long connecting and a SUBSCRIBE's confirmation may take.
    timeout: Duration,
    /// Every channel someone waits on, by name.
    channels: Mutex<HashMap<String, Channel>>,
    /// Sent under this lock, SUBSCRIBE and UNSUBSCRIBE keep their order.
    sink: tokio::sync::Mutex<Option<Live>>,
    ids: AtomicU64,
}

/// The subscriber connection in use.
struct Live {
    sink: PubSubSink,
    /// Which connection this is, so that only its own reader or a
    /// subscribe that timed out on it can drop it.
    generation: u64,
    /// Dropped with the connection: stops its reader, which a silent
    /// server would otherwise keep waiting for ever.
    _stop: oneshot::Sender<()>,
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
    pub(super) fn new(client: super::Endpoint, timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            client,
            timeout,
            channels: Mutex::new(HashMap::new()),
            sink: tokio::sync::Mutex::new(None),
            ids: AtomicU64::new(0),
        })
    }

    /// Subscribes to `channel` (or joins its waiters), returning once Redis
    /// has confirmed, or a timeout error when it has not within the
    /// deadline (the connection is then dropped: the next waiter connects
    /// anew).
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
        // The connection this attempt sends on, once it has one.
        let tried = AtomicU64::new(0);
        let deadline = Instant::now() + self.timeout;
        let confirmed = subscribed.get_or_try_init(|| async {
            let mut slot = self.sink.lock().await;
            let live = self.connected(&mut slot).await?;
            tried.store(live.generation, Ordering::Relaxed);
            live.sink.subscribe(channel).await
        });
        match tokio::time::timeout_at(deadline.into(), confirmed).await {
            Ok(answer) => answer.map(|_| subscription),
            Err(_) => {
                // Waiting for the sink's lock alone: its holder times out
                // on its own deadline, which came first.
                let generation = tried.load(Ordering::Relaxed);
                if generation != 0 {
                    // Free at once unless another subscribe holds it.
                    match self.sink.try_lock() {
                        Ok(mut slot) => self.forget(&mut slot, generation),
                        Err(_) => {
                            let me = self.clone();
                            tokio::spawn(async move { me.drop_connection(generation).await });
                        }
                    }
                }
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "Redis did not confirm the subscription to {channel} within {:?}",
                        self.timeout
                    ),
                )
                .into())
            }
        }
    }

    /// Forgets connection `generation` if it is still the live one: its
    /// waiters are told it is lost (they subscribe again), and the next
    /// subscription connects anew.
    async fn drop_connection(&self, generation: u64) {
        self.forget(&mut *self.sink.lock().await, generation);
    }

    fn forget(&self, slot: &mut Option<Live>, generation: u64) {
        if slot
            .as_ref()
            .is_some_and(|live| live.generation == generation)
        {
            self.channels.lock().expect("channel map poisoned").clear();
            *slot = None;
        }
    }

    /// The live connection, connecting (and starting the reader) if there
    /// is none.
    async fn connected<'a>(
        self: &Arc<Self>,
        slot: &'a mut Option<Live>,
    ) -> redis::RedisResult<&'a mut Live> {
        if slot.is_none() {
            let (sink, mut stream) = self
                .client
                .subscriber_client(self.timeout)
                .await?
                .get_async_pubsub()
                .await?
                .split();
            // Generations start at 1: 0 is "none yet".
            let generation = self.ids.fetch_add(1, Ordering::Relaxed) + 1;
            let (stop, mut stopped) = oneshot::channel::<()>();
            let me = Arc::downgrade(self);
            tokio::spawn(async move {
                loop {
                    let message = tokio::select! {
                        message = stream.next() => message,
                        _ = &mut stopped => return,
                    };
                    let Some(message) = message else { break };
                    let Some(me) = me.upgrade() else { return };
                    let channels = me.channels.lock().expect("channel map poisoned");
                    if let Some(entry) = channels.get(message.get_channel_name()) {
                        entry.signal.send_modify(|n| *n += 1);
                    }
                }
                // The connection is gone: its waiters subscribe again.
                if let Some(me) = me.upgrade() {
                    me.drop_connection(generation).await;
                }
            });
            *slot = Some(Live {
                sink,
                generation,
                _stop: stop,
            });
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
                if let Some(live) = sink.as_mut() {
                    // Under the same deadline: a silent server must not
                    // hold the sink's lock, and the next SUBSCRIBE, for ever.
                    let sent = tokio::time::timeout(me.timeout, live.sink.unsubscribe(&channel));
                    if sent.await.is_err() {
                        let generation = live.generation;
                        me.forget(&mut sink, generation);
                    }
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
