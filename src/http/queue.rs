//! The waiting room's routes: join a voucher's queue, and poll it with the
//! ticket the join gave. Both answer the queue body and when to ask again.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::extract::{header_text, NoBody, User, VoucherIdPath};
use super::responses::{RoomNotFound, TooLarge, Unauthorized, Unavailable};
use super::state::AppState;
use crate::seckill::{QueueState, QueueStatus};

/// The header that carries a queue ticket, to polls and purchases.
pub const QUEUE_TICKET: &str = "x-queue-ticket";
/// The header that carries a join's proof of work, where the room asks.
const QUEUE_PROOF: &str = "x-queue-proof";

/// Where a user stands in a voucher's waiting room.
#[derive(Serialize, ToSchema)]
pub struct QueueBody {
    /// Signed (user, voucher, admission, expiry): send it as
    /// `X-Queue-Ticket` to poll, and once admitted, to buy.
    ticket: String,
    status: QueueStatusBody,
    /// Null until placed: joiners before `begin_time` are placed at random
    /// at the start.
    place: Option<i64>,
    /// Places up to this one are admitted.
    serving: i64,
    /// Until when an admitted ticket buys.
    #[schema(value_type = Option<String>, format = DateTime)]
    admitted_until: Option<DateTime<Utc>>,
    /// People ahead still waiting (null until placed).
    ahead: Option<i64>,
    /// Seconds until this place is served at the room's pace, while waiting.
    estimate_seconds: Option<i64>,
    /// Places handed out so far.
    placed: i64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum QueueStatusBody {
    Waiting,
    Admitted,
    SoldOut,
}

/// The queue body with `status`, and `Retry-After`.
fn queue_answer(status: StatusCode, state: QueueState) -> Response {
    let retry_after = state.retry_after_seconds;
    let body = QueueBody {
        ticket: state.ticket,
        status: match state.status {
            QueueStatus::Waiting => QueueStatusBody::Waiting,
            QueueStatus::Admitted => QueueStatusBody::Admitted,
            QueueStatus::SoldOut => QueueStatusBody::SoldOut,
        },
        place: state.place,
        serving: state.serving,
        admitted_until: state.admitted_until,
        ahead: state.ahead,
        estimate_seconds: state.estimate_seconds,
        placed: state.placed,
    };
    (
        status,
        [(header::RETRY_AFTER, HeaderValue::from(retry_after))],
        Json(body),
    )
        .into_response()
}

#[utoipa::path(
    post, path = "/vouchers/{id}/queue", tag = "sale",
    params(
        VoucherIdPath,
        ("X-Queue-Proof" = Option<String>, Header, description = "Where the room asks for proof of work (waiting_room.proof_of_work_bits > 0): a nonce of at most 64 characters such that SHA-256 of \"seckill-queue:<voucher>:<user>:<nonce>\" starts with that many zero bits"),
    ),
    security(("user" = [])),
    responses(
        (status = 202, description = "In the room (joined now, or the user's place already); Retry-After says when to poll", body = QueueBody),
        (status = 400, description = "bad_request: a body, or a missing or wrong proof of work where the room asks for one", body = ErrorBody),
        (status = 409, description = "ended: the sale is over", body = ErrorBody),
        Unauthorized,
        RoomNotFound,
        TooLarge, Unavailable,
    )
)]
pub async fn join(
    State(state): State<AppState>,
    User(user_id): User,
    VoucherIdPath(voucher_id): VoucherIdPath,
    headers: HeaderMap,
    NoBody: NoBody,
) -> Result<Response, ApiError> {
    let proof = header_text(&headers, QUEUE_PROOF);
    let queued = state.seckill.join_queue(user_id, voucher_id, proof).await?;
    Ok(queue_answer(StatusCode::ACCEPTED, queued))
}

#[utoipa::path(
    get, path = "/vouchers/{id}/queue", tag = "sale",
    params(
        VoucherIdPath,
        ("X-Queue-Ticket" = String, Header, description = "The ticket the join (or the last poll) gave"),
    ),
    security(("user" = [])),
    responses(
        (status = 200, description = "Where the user stands; Retry-After says when to poll again", body = QueueBody),
        (status = 400, description = "bad_request: no X-Queue-Ticket, or not this user's for this voucher", body = ErrorBody),
        (status = 409, description = "ended: the sale is over", body = ErrorBody),
        Unauthorized,
        RoomNotFound,
        TooLarge, Unavailable,
    )
)]
pub async fn poll(
    State(state): State<AppState>,
    User(user_id): User,
    VoucherIdPath(voucher_id): VoucherIdPath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let ticket = header_text(&headers, QUEUE_TICKET)
        .ok_or_else(|| ApiError::BadRequest("send the queue's ticket as X-Queue-Ticket".into()))?;
    let queued = state
        .seckill
        .poll_queue(user_id, voucher_id, ticket)
        .await?;
    Ok(queue_answer(StatusCode::OK, queued))
}
