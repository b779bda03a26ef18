//! The shop's webhook receiver, as the API tests and the load driver run
//! it: an HTTP server on a free loopback port that checks every delivery's
//! signature, keeps each signed delivery (its events, whether it was
//! acknowledged, when it came) and answers as told.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::webhook_signed;

/// How the receiver answers a signed delivery.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Answering {
    /// `204`.
    Acknowledge,
    /// Acknowledges a batch of one event, fails a larger one.
    AcknowledgeOne,
    /// `503`, at once.
    Fail,
    /// No answer for an hour.
    Hang,
    /// `307` to itself.
    Redirect,
}

/// One signed delivery.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The batch's events, as sent.
    pub events: Vec<Value>,
    /// Whether it was answered `204`.
    pub acknowledged: bool,
    /// When it came.
    pub at: Instant,
    /// When it came, by the wall clock (an event's `created_at` is one).
    pub at_utc: chrono::DateTime<chrono::Utc>,
}

/// The events of the acknowledged ones among `deliveries`, in their order.
pub fn acknowledged(deliveries: &[Delivery]) -> impl Iterator<Item = &Value> {
    deliveries
        .iter()
        .filter(|d| d.acknowledged)
        .flat_map(|d| &d.events)
}

/// A running receiver; clones share it.
#[derive(Clone)]
pub struct Receiver {
    secret: Arc<[u8]>,
    answering: Arc<Mutex<Answering>>,
    deliveries: Arc<Mutex<Vec<Delivery>>>,
    bad_signatures: Arc<AtomicU64>,
}

impl Receiver {
    /// Listens on a free loopback port, checking signatures under `secret`;
    /// the receiver and its URL (`http://127.0.0.1:PORT/hooks`).
    pub async fn start(secret: &[u8], answering: Answering) -> anyhow::Result<(Self, String)> {
        let receiver = Self {
            secret: Arc::from(secret),
            answering: Arc::new(Mutex::new(answering)),
            deliveries: Arc::default(),
            bad_signatures: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("the receiver cannot listen")?;
        let url = format!("http://{}/hooks", listener.local_addr()?);
        let router = axum::Router::new()
            .route("/hooks", axum::routing::post(receive))
            .with_state(receiver.clone());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Ok((receiver, url))
    }

    /// Answers the next deliveries so.
    pub fn set(&self, answering: Answering) {
        *self.answering.lock().expect("receiver lock") = answering;
    }

    /// What `read` makes of every signed delivery so far, in the order
    /// they came.
    pub fn deliveries<T>(&self, read: impl FnOnce(&[Delivery]) -> T) -> T {
        read(&self.deliveries.lock().expect("receiver lock"))
    }

    /// Signed deliveries so far, answered or not.
    pub fn attempts(&self) -> usize {
        self.deliveries(<[Delivery]>::len)
    }

    /// The events of the acknowledged deliveries, in the order they came.
    pub fn acknowledged(&self) -> Vec<Value> {
        self.deliveries(|deliveries| acknowledged(deliveries).cloned().collect())
    }

    /// Deliveries refused for a missing or wrong signature (or not JSON).
    pub fn bad_signatures(&self) -> u64 {
        self.bad_signatures.load(Ordering::Relaxed)
    }

    /// Waits, every `pause` for `limit` at most, until `done` holds of the
    /// deliveries; whether it did.
    pub async fn wait_until(
        &self,
        limit: Duration,
        pause: Duration,
        done: impl Fn(&[Delivery]) -> bool,
    ) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.deliveries(&done) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// The signature check a shop's receiver makes, and a JSON body.
    fn signed(&self, headers: &HeaderMap, body: &[u8]) -> bool {
        let json = headers.get("content-type").map(|v| v.as_bytes()) == Some(b"application/json");
        let now = chrono::Utc::now().timestamp();
        json && headers
            .get("x-seckill-signature")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|header| webhook_signed(&self.secret, header, body, now))
    }
}

async fn receive(State(receiver): State<Receiver>, headers: HeaderMap, body: Bytes) -> Response {
    let events = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["events"].as_array().cloned());
    let (true, Some(events)) = (receiver.signed(&headers, &body), events) else {
        receiver.bad_signatures.fetch_add(1, Ordering::Relaxed);
        return StatusCode::BAD_REQUEST.into_response();
    };
    let answering = match *receiver.answering.lock().expect("receiver lock") {
        Answering::AcknowledgeOne if events.len() == 1 => Answering::Acknowledge,
        Answering::AcknowledgeOne => Answering::Fail,
        answering => answering,
    };
    receiver
        .deliveries
        .lock()
        .expect("receiver lock")
        .push(Delivery {
            events,
            acknowledged: answering == Answering::Acknowledge,
            at: Instant::now(),
            at_utc: chrono::Utc::now(),
        });
    match answering {
        Answering::Acknowledge | Answering::AcknowledgeOne => {
            StatusCode::NO_CONTENT.into_response()
        }
        Answering::Fail => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        Answering::Redirect => {
            (StatusCode::TEMPORARY_REDIRECT, [("location", "/hooks")]).into_response()
        }
        Answering::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            StatusCode::NO_CONTENT.into_response()
        }
    }
}
