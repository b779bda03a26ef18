//! The order lifecycle's routes: a buyer (or an admin) cancels an unpaid
//! order; a payment provider notifies a payment, signed with HMAC-SHA256
//! over the raw body, as WeChat Pay, Alipay and Stripe sign theirs.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::extract::{from_object, Caller, NoBody, OrderIdPath};
use super::responses::{OrderNotFound, TooLarge, Unauthorized, Unavailable};
use super::screen::MAX_BODY_BYTES;
use super::state::AppState;
use crate::domain::OrderId;
use crate::domain::OrderStatus;
use crate::events::body::OrderBody;
use crate::seckill::Payment;

/// The header that carries a notification's signature.
pub(super) const SIGNATURE_HEADER: &str = "x-signature";
/// Longest payment id a provider may send.
const PAYMENT_ID_MAX_CHARS: usize = 64;

#[utoipa::path(
    post, path = "/orders/{order_id}/cancel", tag = "orders",
    params(OrderIdPath),
    security(("user" = []), ("admin" = [])),
    responses(
        (status = 200, description = "The order, now cancelled (or cancelled already); its unit went back on sale once", body = OrderBody),
        (status = 400, description = "bad_request: a malformed id, or a body", body = ErrorBody),
        Unauthorized,
        OrderNotFound,
        (status = 409, description = "already_paid, order_expired, or order_pending (async, not stored yet; Retry-After is set)", body = ErrorBody),
        TooLarge, Unavailable,
    )
)]
pub async fn cancel_order(
    State(state): State<AppState>,
    caller: Caller,
    OrderIdPath(order_id): OrderIdPath,
    NoBody: NoBody,
) -> Result<Json<OrderBody>, ApiError> {
    let user = match caller {
        Caller::User(user_id) => Some(user_id),
        Caller::Admin => None,
    };
    Ok(Json(state.seckill.cancel(order_id, user).await?.into()))
}

/// A payment provider's notification.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PaymentNotice {
    /// The provider's id of the payment: deliveries of one payment carry
    /// the same one.
    #[schema(min_length = 1, max_length = 64, example = "pay_3MtwBwLkdIwHu7ix")]
    payment_id: String,
    /// The order paid for, in decimal.
    #[schema(pattern = "^[1-9][0-9]{0,18}$", example = "669711463081050113")]
    order_id: String,
    /// What was paid: to pay an unpaid order, the voucher's price times the
    /// order's quantity; any amount for a closed order is refunded.
    #[schema(minimum = 0, example = 990)]
    amount_cents: i64,
}

/// What became of a notified payment.
#[derive(Serialize, ToSchema)]
pub struct PaymentReceipt {
    #[schema(pattern = "^[1-9][0-9]{0,18}$")]
    order_id: String,
    /// The order as it stands after the notification.
    status: OrderStatus,
    /// `true`: the order could not take this payment (paid already,
    /// cancelled or expired); the money goes back to the buyer.
    refund: bool,
}

#[utoipa::path(
    post, path = "/payments/notify", tag = "orders",
    request_body = PaymentNotice,
    params(("X-Signature" = String, Header, description = "sha256=<hex HMAC-SHA256 of the raw body under SECKILL_PAYMENT_SECRET>")),
    responses(
        (status = 200, description = "Recorded (idempotent by payment_id): paid in time, or to be refunded", body = PaymentReceipt),
        (status = 400, description = "bad_request: a malformed body, or an amount other than the order's price (price times quantity) for a payment that would pay it", body = ErrorBody),
        (status = 401, description = "unauthorized: a missing or wrong signature", body = ErrorBody),
        (status = 403, description = "forbidden: no payment secret is configured", body = ErrorBody),
        (status = 404, description = "not_found: no such order", body = ErrorBody),
        (status = 409, description = "order_pending: an async order not stored yet (Retry-After is set); payment_conflict: this payment_id was recorded for another order or amount, also when both arrive at once", body = ErrorBody),
        TooLarge, Unavailable,
    )
)]
pub async fn notify(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<PaymentReceipt>, ApiError> {
    // Judged from the head, before a byte of the body is read: a caller
    // without a well-formed signature costs no body.
    let Some(secret) = state.payment_secret.as_deref() else {
        return Err(ApiError::Forbidden);
    };
    let signature = signature(&headers)?;
    let body = read_body(body).await?;
    verify_signature(secret, &signature, &body)?;
    let notice: PaymentNotice = parse_notice(&body)?;
    let chars = notice.payment_id.chars().count();
    if chars == 0 || chars > PAYMENT_ID_MAX_CHARS || notice.payment_id.chars().any(char::is_control)
    {
        return Err(ApiError::BadRequest(format!(
            "payment_id must have 1 to {PAYMENT_ID_MAX_CHARS} characters, none of them control characters"
        )));
    }
    if notice.amount_cents < 0 {
        return Err(ApiError::BadRequest(
            "amount_cents must not be negative".into(),
        ));
    }
    let order_id: OrderId = notice
        .order_id
        .parse()
        .map_err(|_: crate::domain::NotAnOrderId| {
            ApiError::BadRequest("order_id must be a positive 64-bit integer in decimal".into())
        })?;
    let answer = state
        .seckill
        .pay(Payment {
            payment_id: notice.payment_id,
            order_id,
            amount_cents: notice.amount_cents,
        })
        .await?;
    Ok(Json(PaymentReceipt {
        order_id: answer.order_id.to_string(),
        status: answer.status,
        refund: answer.refund,
    }))
}

/// The `X-Signature` value a payment provider sends with `body`:
/// `sha256=<hex HMAC-SHA256 of body under secret>` (for providers' test
/// rigs and the load driver; the service only verifies).
pub fn signature_header(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

fn unauthorized(why: &str) -> ApiError {
    ApiError::Unauthorized(format!("payment notification: {why}"))
}

/// The tag of the one `X-Signature: sha256=<hex of 32 bytes>` header.
fn signature(headers: &HeaderMap) -> Result<Vec<u8>, ApiError> {
    let mut values = headers.get_all(SIGNATURE_HEADER).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(unauthorized("exactly one X-Signature header is required"));
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().strip_prefix("sha256="))
        .and_then(decode_hex)
        .filter(|tag| tag.len() == 32)
        .ok_or_else(|| unauthorized("X-Signature must be sha256=<64 hex digits>"))
}

/// The whole body, at most the limit (`413` past it).
async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    let limit = usize::try_from(MAX_BODY_BYTES).unwrap_or(usize::MAX);
    axum::body::to_bytes(body, limit).await.map_err(|error| {
        let over = std::error::Error::source(&error)
            .is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
        if over {
            ApiError::PayloadTooLarge(format!(
                "the body is over the limit of {MAX_BODY_BYTES} bytes"
            ))
        } else {
            ApiError::BadRequest(format!("cannot read the body: {error}"))
        }
    })
}

/// Checks a signature's tag against the HMAC-SHA256 of `body` under
/// `secret`, in constant time.
fn verify_signature(secret: &[u8], tag: &[u8], body: &[u8]) -> Result<(), ApiError> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret)
        .map_err(|_| unauthorized("the payment secret is unusable"))?;
    mac.update(body);
    mac.verify_slice(tag)
        .map_err(|_| unauthorized("the signature does not match the body"))
}

/// Bytes from lower- or upper-case hex; `None` for anything else.
fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if hex.len() % 2 != 0 {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The notification, once its signature holds: a JSON object of exactly
/// the three fields (read from the signed bytes, whatever its content type).
fn parse_notice(body: &[u8]) -> Result<PaymentNotice, ApiError> {
    from_object(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(signature: &str) -> HeaderMap {
        crate::http::one_header(SIGNATURE_HEADER, signature)
    }

    /// The whole check: the header's form, then the tag over the body.
    fn verify_signature(secret: &[u8], headers: &HeaderMap, body: &[u8]) -> Result<(), ApiError> {
        super::verify_signature(secret, &signature(headers)?, body)
    }

    #[test]
    fn a_signature_over_the_exact_body_under_the_secret_passes_and_nothing_else() {
        let body = br#"{"payment_id":"p1","order_id":"5","amount_cents":1}"#;
        let good = signature_header(b"key", body);
        assert!(verify_signature(b"key", &headers(&good), body).is_ok());
        assert!(verify_signature(
            b"key",
            &headers(&good.to_uppercase().replace("SHA256=", "sha256=")),
            body
        )
        .is_ok());
        // Another key, another body, a cut or malformed tag, no header.
        assert!(verify_signature(b"other", &headers(&good), body).is_err());
        assert!(verify_signature(b"key", &headers(&good), b"{}").is_err());
        assert!(verify_signature(b"key", &headers(&good[..good.len() - 2]), body).is_err());
        assert!(verify_signature(b"key", &headers("sha256=zz"), body).is_err());
        assert!(
            verify_signature(b"key", &headers(&good.replace("sha256=", "md5=")), body).is_err()
        );
        assert!(verify_signature(b"key", &HeaderMap::new(), body).is_err());
    }

    #[test]
    fn hex_decodes_pairs_of_digits_only() {
        assert_eq!(decode_hex("00ff7A"), Some(vec![0, 255, 122]));
        assert_eq!(decode_hex("0"), None);
        assert_eq!(decode_hex("0g"), None);
        assert_eq!(decode_hex("é0"), None);
    }
}
