//! The one place that turns errors into HTTP statuses and JSON bodies
//! `{"error": "<code>", "message": "<text>"}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::seckill::SeckillError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("this route needs the admin token")]
    Forbidden,
    #[error("{0}")]
    NotFound(String),
    #[error("this method is not allowed on this path")]
    MethodNotAllowed,
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error(transparent)]
    Seckill(#[from] SeckillError),
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        use SeckillError as S;
        match self {
            Self::BadRequest(_) | Self::Seckill(S::Invalid(_)) => {
                (StatusCode::BAD_REQUEST, "bad_request")
            }
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
            Self::NotFound(_) | Self::Seckill(S::NotFound(_)) => {
                (StatusCode::NOT_FOUND, "not_found")
            }
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Self::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::Seckill(S::NotStarted) => (StatusCode::CONFLICT, "not_started"),
            Self::Seckill(S::Ended) => (StatusCode::CONFLICT, "ended"),
            Self::Seckill(S::SoldOut) => (StatusCode::CONFLICT, "sold_out"),
            Self::Seckill(S::AlreadyPurchased { .. }) => {
                (StatusCode::CONFLICT, "already_purchased")
            }
            Self::Seckill(S::InProgress) => (StatusCode::TOO_MANY_REQUESTS, "purchase_in_progress"),
            Self::Seckill(S::Unavailable { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
            }
            Self::Seckill(S::Internal(_)) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

/// Seconds a client should wait before retrying after a 503.
const RETRY_AFTER_SECS: &str = "1";
/// Longest message sent back: messages may quote the input, and an answer
/// must not grow with what a client sends.
const MAX_MESSAGE_CHARS: usize = 200;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let message = match &self {
            Self::Seckill(SeckillError::Internal(cause)) => {
                // Opaque to the client, whole in the log.
                tracing::error!(%cause, "internal error");
                "internal error".to_owned()
            }
            Self::Seckill(SeckillError::Unavailable { dependency, detail }) => {
                tracing::warn!(dependency, %detail, "dependency unavailable");
                format!("{dependency} is unavailable; retry shortly")
            }
            other => bounded(other.to_string()),
        };
        let mut body = json!({ "error": code, "message": message });
        if let Self::Seckill(SeckillError::AlreadyPurchased {
            order_id: Some(order_id),
        }) = &self
        {
            // A retry after a lost answer learns its order from here.
            body["order_id"] = json!(order_id.to_string());
        }
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        response
    }
}

/// `text` cut to [`MAX_MESSAGE_CHARS`] characters, marked where it was cut.
fn bounded(text: String) -> String {
    match text.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}
