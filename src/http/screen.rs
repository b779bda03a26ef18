//! Screening before routing: what no route may accept, refused the same
//! way on every route, and what no client may make the service keep or
//! echo without bound.

use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::REQUEST_ID;

/// Largest request body on any route (axum's JSON limit is the same).
pub const MAX_BODY_BYTES: u64 = 2 * 1024 * 1024;
/// Longest `x-request-id` taken from a client; a longer or odd one is
/// replaced by a fresh id instead of being logged and echoed.
const MAX_REQUEST_ID_CHARS: usize = 64;

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
