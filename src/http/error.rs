//! The one place that turns errors into HTTP statuses and JSON bodies
//! `{"error": "<code>", "message": "<text>"}`.

use std::io::Write as _;
use std::sync::LazyLock;

use axum::body::Bytes;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::seckill::{OrderError, OrderRefusal, PurchaseError, Refusal, SeckillError};
use crate::telemetry::Chain;

/// Every error's body.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    error: ErrorCode,
    /// For people; at most 200 characters (and `...` where it was cut).
    #[schema(max_length = 203)]
    message: String,
    /// With `already_purchased`: the order the user holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[1-9][0-9]{0,18}$")]
    order_id: Option<String>,
    /// With `not_enough_stock`: the units left, fewer than asked for (a
    /// buyer may ask again for at most this many).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    stock: Option<i32>,
    /// With `bad_request` from a waiting room that asks for proof of work:
    /// the user's challenge; `X-Queue-Proof` is a nonce such that SHA-256
    /// of the challenge followed by the nonce starts with `proof_bits`
    /// zero bits.
    #[serde(skip_serializing_if = "Option::is_none")]
    challenge: Option<String>,
    /// With `challenge`: the zero bits the proof needs.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 32)]
    proof_bits: Option<u32>,
}

/// The machine-readable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    PayloadTooLarge,
    NotStarted,
    Ended,
    SoldOut,
    NotEnoughStock,
    AlreadyPurchased,
    AlreadyPaid,
    OrderExpired,
    OrderPending,
    NotAdmitted,
    TooManyOrders,
    PaymentConflict,
    PurchaseInProgress,
    RateLimited,
    Unavailable,
    Internal,
}

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
    /// Over the client address's rate limit; the client may retry after
    /// this many seconds.
    #[error("too many requests from this client; retry after the time in Retry-After")]
    RateLimited(u64),
    /// Over the user's rate limit (whatever the address): the same code
    /// and header as [`ApiError::RateLimited`], a message that says whose.
    #[error(
        "too many requests from this user (the per-user limit, whatever the address); \
         retry after the time in Retry-After"
    )]
    UserRateLimited(u64),
    /// Shed: the instance is saturated and refuses this request's class
    /// for now (see `shed`).
    #[error("the instance is saturated and sheds requests like this one; retry shortly")]
    Overloaded,
    /// What any operation can fail with.
    #[error(transparent)]
    Seckill(#[from] SeckillError),
    /// A purchase the sale refused.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// A cancel or a payment the order refused.
    #[error(transparent)]
    OrderRefused(#[from] OrderRefusal),
}

impl From<PurchaseError> for ApiError {
    fn from(error: PurchaseError) -> Self {
        match error {
            PurchaseError::Refused(refusal) => Self::Refused(refusal),
            PurchaseError::Failed(error) => Self::Seckill(error),
        }
    }
}

impl From<OrderError> for ApiError {
    fn from(error: OrderError) -> Self {
        match error {
            OrderError::Refused(refusal) => Self::OrderRefused(refusal),
            OrderError::Failed(error) => Self::Seckill(error),
        }
    }
}

impl From<crate::auth::AuthError> for ApiError {
    fn from(error: crate::auth::AuthError) -> Self {
        use crate::auth::AuthError as A;
        match error {
            A::Unauthorized(why) => Self::Unauthorized(why),
            A::Unavailable { dependency, detail } => {
                Self::Seckill(SeckillError::unavailable(dependency, detail))
            }
        }
    }
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, ErrorCode) {
        use ErrorCode as C;
        use OrderRefusal as O;
        use Refusal as R;
        use SeckillError as S;
        match self {
            Self::BadRequest(_)
            | Self::Seckill(S::Invalid(_))
            | Self::Seckill(S::ProofNeeded { .. }) => (StatusCode::BAD_REQUEST, C::BadRequest),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, C::Unauthorized),
            Self::Forbidden => (StatusCode::FORBIDDEN, C::Forbidden),
            Self::NotFound(_) | Self::Seckill(S::NotFound(_)) => {
                (StatusCode::NOT_FOUND, C::NotFound)
            }
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, C::MethodNotAllowed),
            Self::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, C::PayloadTooLarge),
            Self::RateLimited(_) | Self::UserRateLimited(_) => {
                (StatusCode::TOO_MANY_REQUESTS, C::RateLimited)
            }
            Self::Overloaded => (StatusCode::SERVICE_UNAVAILABLE, C::Unavailable),
            Self::Refused(refusal) => match refusal {
                R::NotStarted => (StatusCode::CONFLICT, C::NotStarted),
                R::Ended => (StatusCode::CONFLICT, C::Ended),
                R::SoldOut => (StatusCode::CONFLICT, C::SoldOut),
                R::NotEnoughStock { .. } => (StatusCode::CONFLICT, C::NotEnoughStock),
                R::AlreadyPurchased { .. } => (StatusCode::CONFLICT, C::AlreadyPurchased),
                R::TooManyOrders(_) => (StatusCode::CONFLICT, C::TooManyOrders),
                R::NotAdmitted(_) => (StatusCode::FORBIDDEN, C::NotAdmitted),
                R::InProgress => (StatusCode::TOO_MANY_REQUESTS, C::PurchaseInProgress),
            },
            Self::OrderRefused(refusal) => match refusal {
                O::AlreadyPaid => (StatusCode::CONFLICT, C::AlreadyPaid),
                O::Expired => (StatusCode::CONFLICT, C::OrderExpired),
                O::Pending => (StatusCode::CONFLICT, C::OrderPending),
                O::PaymentConflict => (StatusCode::CONFLICT, C::PaymentConflict),
            },
            Self::Seckill(S::Unavailable { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, C::Unavailable)
            }
            Self::Seckill(S::Internal(_)) => (StatusCode::INTERNAL_SERVER_ERROR, C::Internal),
        }
    }
}

/// Seconds a client should wait before retrying after a 503.
const RETRY_AFTER_SECS: &str = "1";
/// Longest message sent back: messages may quote the input, and an answer
/// must not grow with what a client sends.
const MAX_MESSAGE_CHARS: usize = 200;

/// The refusals a crowd gets by the thousand, whose text never changes
/// (a rate limit's `seconds` is a header, not in the body).
fn fixed_errors() -> [ApiError; 6] {
    [
        ApiError::Refused(Refusal::SoldOut),
        ApiError::Refused(Refusal::Ended),
        ApiError::Refused(Refusal::NotStarted),
        ApiError::Refused(Refusal::InProgress),
        ApiError::RateLimited(1),
        ApiError::UserRateLimited(1),
    ]
}

/// The bodies of [`fixed_errors`], serialized once, in its order: a
/// sold-out voucher's flood then costs no formatting and no JSON writer
/// per request.
static FIXED_BODIES: LazyLock<[Bytes; 6]> = LazyLock::new(|| {
    fixed_errors().map(|error| {
        let (_, code) = error.status_and_code();
        let body = serde_json::to_vec(&error.body(code)).expect("an error body serializes");
        Bytes::from(body)
    })
});

impl ApiError {
    /// The body that tells the client this error.
    fn body(&self, code: ErrorCode) -> ErrorBody {
        let message = match self {
            Self::Seckill(error @ SeckillError::Internal(_)) => {
                // Opaque to the client, whole in the log.
                tracing::error!(error = %Chain(error), "internal error");
                "internal error".to_owned()
            }
            Self::Seckill(error @ SeckillError::Unavailable { dependency, .. }) => {
                tracing::warn!(dependency, error = %Chain(error), "dependency unavailable");
                format!("{dependency} is unavailable; retry shortly")
            }
            other => bounded(other.to_string()),
        };
        // A retry after a lost answer learns its order from here.
        let order_id = match self {
            Self::Refused(Refusal::AlreadyPurchased {
                order_id: Some(order_id),
            }) => Some(order_id.to_string()),
            _ => None,
        };
        let stock = match self {
            Self::Refused(Refusal::NotEnoughStock { stock }) => Some(*stock),
            _ => None,
        };
        let (challenge, proof_bits) = match self {
            Self::Seckill(SeckillError::ProofNeeded { challenge, bits }) => {
                (Some(challenge.clone()), Some(*bits))
            }
            _ => (None, None),
        };
        ErrorBody {
            error: code,
            message,
            order_id,
            stock,
            challenge,
            proof_bits,
        }
    }

    /// The serialized body of this error when it is one of
    /// [`fixed_errors`] (the place in that list, matched here).
    fn fixed_body(&self) -> Option<Bytes> {
        let at = match self {
            Self::Refused(Refusal::SoldOut) => 0,
            Self::Refused(Refusal::Ended) => 1,
            Self::Refused(Refusal::NotStarted) => 2,
            Self::Refused(Refusal::InProgress) => 3,
            Self::RateLimited(_) => 4,
            Self::UserRateLimited(_) => 5,
            _ => return None,
        };
        Some(FIXED_BODIES[at].clone())
    }

    /// A holder's refusal, the one a bot asking again gets by the thousand:
    /// the body of `already_purchased` without an order, serialized once,
    /// with the order's id put in before its closing brace.
    fn holder_body(&self) -> Option<Bytes> {
        let Self::Refused(Refusal::AlreadyPurchased {
            order_id: Some(order_id),
        }) = self
        else {
            return None;
        };
        let open = HOLDER_BODY.strip_suffix(b"}")?;
        let mut body = Vec::with_capacity(open.len() + 36);
        body.extend_from_slice(open);
        // An order id is a positive integer: nothing in it to escape.
        write!(body, r#","order_id":"{order_id}"}}"#).ok()?;
        Some(Bytes::from(body))
    }
}

/// The body of `already_purchased` without an order id, serialized once
/// ([`ApiError::holder_body`] adds the id).
static HOLDER_BODY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let error = ApiError::Refused(Refusal::AlreadyPurchased { order_id: None });
    let (_, code) = error.status_and_code();
    serde_json::to_vec(&error.body(code)).expect("an error body serializes")
});

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let mut response = match self.fixed_body().or_else(|| self.holder_body()) {
            Some(body) => (
                status,
                [(header::CONTENT_TYPE, HeaderValue::from_static(JSON))],
                body,
            )
                .into_response(),
            None => (status, Json(self.body(code))).into_response(),
        };
        // For the middleware that watches answers (the sale monitor).
        response.extensions_mut().insert(code);
        if let Self::RateLimited(seconds) | Self::UserRateLimited(seconds) = self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
        } else if status == StatusCode::SERVICE_UNAVAILABLE
            || matches!(
                code,
                ErrorCode::OrderPending | ErrorCode::PurchaseInProgress
            )
        {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        response
    }
}

/// The content type axum's `Json` answers with, for the fixed bodies too.
const JSON: &str = "application/json";

/// `text` cut to [`MAX_MESSAGE_CHARS`] characters, marked where it was cut.
fn bounded(text: String) -> String {
    match text.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Outcome;

    /// A purchase refused for a reason the metrics name carries that name
    /// as its error code: the two are one word, from [`Outcome`].
    #[test]
    fn a_refusals_error_code_is_its_outcomes_label() {
        let refusals: [PurchaseError; 10] = [
            SeckillError::NotFound("voucher").into(),
            Refusal::NotStarted.into(),
            Refusal::Ended.into(),
            Refusal::SoldOut.into(),
            Refusal::NotEnoughStock { stock: 1 }.into(),
            Refusal::AlreadyPurchased { order_id: None }.into(),
            Refusal::InProgress.into(),
            Refusal::TooManyOrders(3).into(),
            Refusal::NotAdmitted("no ticket").into(),
            SeckillError::redis_unavailable("down").into(),
        ];
        let mut seen = std::collections::HashSet::new();
        for error in refusals {
            let outcome = error.outcome();
            assert_ne!(outcome, Outcome::Error, "{error:?}");
            seen.insert(outcome);
            let (_, code) = ApiError::from(error).status_and_code();
            assert_eq!(
                serde_json::to_value(code).unwrap(),
                outcome.label(),
                "{outcome:?}"
            );
        }
        // Every outcome but the successes and the catch-all was tried.
        let rest: Vec<Outcome> = Outcome::ALL
            .into_iter()
            .filter(|o| !seen.contains(o))
            .collect();
        assert_eq!(rest, [Outcome::Ordered, Outcome::Accepted, Outcome::Error]);
    }

    /// Each body served from [`FIXED_BODIES`] is the one its error would
    /// be given if it were written afresh: the list and the match in
    /// `fixed_body` agree.
    #[test]
    fn a_fixed_body_is_its_own_errors_body() {
        for error in fixed_errors() {
            let (_, code) = error.status_and_code();
            let fresh = serde_json::to_vec(&error.body(code)).unwrap();
            assert_eq!(error.fixed_body().as_deref(), Some(&fresh[..]), "{error:?}");
        }
        // The two limits' refusals say whose allowance ran out.
        assert!(ApiError::UserRateLimited(7)
            .to_string()
            .contains("this user"));
        assert!(ApiError::RateLimited(7).to_string().contains("this client"));
        // Both are `429 rate_limited` with their own Retry-After.
        for refused in [ApiError::RateLimited(7), ApiError::UserRateLimited(7)] {
            let response = refused.into_response();
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(response.headers()[header::RETRY_AFTER], "7");
            assert_eq!(
                response.extensions().get::<ErrorCode>(),
                Some(&ErrorCode::RateLimited)
            );
        }
        assert!(ApiError::Refused(Refusal::TooManyOrders(3))
            .fixed_body()
            .is_none());
    }

    /// A holder's refusal, put together from its serialized prefix, is
    /// byte for byte what serializing its body says, for the smallest and
    /// the largest order ids; without an order it is serialized whole.
    #[test]
    fn a_holders_refusal_is_the_body_serde_writes() {
        for id in [1, 42, i64::MAX] {
            let order_id = crate::domain::OrderId::from_stored(id).unwrap();
            let error = ApiError::Refused(Refusal::AlreadyPurchased {
                order_id: Some(order_id),
            });
            let (_, code) = error.status_and_code();
            let serialized = serde_json::to_vec(&error.body(code)).unwrap();
            assert_eq!(error.holder_body().unwrap(), serialized);
            let body: serde_json::Value = serde_json::from_slice(&serialized).unwrap();
            assert_eq!(body["error"], "already_purchased");
            assert_eq!(body["order_id"], id.to_string());
        }
        let unknown = ApiError::Refused(Refusal::AlreadyPurchased { order_id: None });
        assert!(unknown.holder_body().is_none());
    }
}
