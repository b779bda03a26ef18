//! Screening before routing: what no route may accept, refused the same
//! way on every route, and what no client may make the service keep or
//! echo without bound.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};
use tokio::time::Sleep;

use super::error::ApiError;
use super::extract::says_no_body;

/// Largest request body on any route (axum's JSON limit is the same).
pub const MAX_BODY_BYTES: u64 = 2 * 1024 * 1024;
/// Longest `x-request-id` taken from a client; a longer or odd one is
/// replaced by a fresh id instead of being logged and echoed.
const MAX_REQUEST_ID_CHARS: usize = 64;

/// The header that carries a request's id, in and out.
pub(super) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Refuses what no route accepts: several `Authorization` headers (a proxy
/// may have read another one than we would: which caller this is cannot be
/// told) and a body announced over the limit, before any route reads it.
pub async fn screen(request: Request, next: Next) -> Response {
    if request
        .headers()
        .get_all(header::AUTHORIZATION)
        .iter()
        .count()
        > 1
    {
        return ApiError::BadRequest("send one Authorization header, not several".into())
            .into_response();
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES) {
        return ApiError::PayloadTooLarge(format!(
            "the body is over the limit of {MAX_BODY_BYTES} bytes"
        ))
        .into_response();
    }
    next.run(request).await
}

/// Drops a client's `x-request-id` that is too long or not a plain token,
/// so that the next layer sets a fresh one.
pub async fn sanitize_request_id(mut request: Request, next: Next) -> Response {
    if let Some(id) = request.headers().get(&REQUEST_ID) {
        if !is_plain_id(id) {
            request.headers_mut().remove(&REQUEST_ID);
        }
    }
    next.run(request).await
}

fn is_plain_id(id: &HeaderValue) -> bool {
    let bytes = id.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_REQUEST_ID_CHARS
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(b))
}

/// Gives every request body one deadline for all of it, counted from its
/// headers: a client that sends a byte every few seconds is cut off then,
/// however steadily it trickles (a deadline per frame restarts with each
/// byte). Its request fails, and its connection closes after the answer.
pub async fn body_deadline(
    State(limit): State<Duration>,
    request: Request,
    next: Next,
) -> Response {
    if request.version() <= Version::HTTP_11 && says_no_body(request.headers()) {
        return next.run(request).await;
    }
    let expired = Arc::new(AtomicBool::new(false));
    let request = request.map(|body| {
        Body::new(Deadline {
            inner: body,
            sleep: Box::pin(tokio::time::sleep(limit)),
            limit,
            polled: false,
            expired: expired.clone(),
        })
    });
    let mut response = next.run(request).await;
    if expired.load(Ordering::Relaxed) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A body that fails once its deadline has passed.
struct Deadline {
    inner: Body,
    sleep: Pin<Box<Sleep>>,
    limit: Duration,
    /// Whether the handler has asked for the body yet.
    polled: bool,
    expired: Arc<AtomicBool>,
}

/// What a body is given from the moment its handler first asks for it,
/// whenever its own deadline falls: hyper reads a body frame by frame as
/// it is asked (and answers `Expect: 100-continue` only then), so a body
/// that arrived whole while its request waited before the handler (a JWK
/// Set fetched for its token) still needs a moment to be read.
const AFTER_FIRST_ASK: Duration = Duration::from_secs(1);

/// The error of a body that came too slowly.
#[derive(Debug, thiserror::Error)]
#[error("the body did not arrive within {0:?}")]
struct TooSlow(Duration);

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if !self.polled {
            self.polled = true;
            let floor = tokio::time::Instant::now() + AFTER_FIRST_ASK.min(self.limit);
            if self.sleep.deadline() < floor {
                self.sleep.as_mut().reset(floor);
            }
        }
        // What has arrived is read first: the deadline counts from the
        // headers, and the time the request spent before its handler read
        // the body (a JWK Set fetched for its token, a lookup of its
        // subject) is not the client's. Only a body still missing when the
        // deadline has passed fails; the deadline's timer wakes this task
        // then.
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            self.expired.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(TooSlow(self.limit).into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
