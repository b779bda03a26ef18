//! Extractors that turn a request into typed values or the app's own
//! 4xx errors: JSON bodies, ids in paths, and who is calling.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::Json;
use serde::de::DeserializeOwned;
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::AppState;
use crate::id::{parse_positive, OrderId};

/// A JSON body whose rejections are the app's `bad_request` errors.
pub struct AppJson<T>(pub T);

impl<S, T> FromRequest<S> for AppJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    let text = rejection.body_text();
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge(text)
    } else {
        ApiError::BadRequest(text)
    }
}

/// The single `{id}` of a path, as a voucher id.
pub struct VoucherIdPath(pub i64);

impl<S: Send + Sync> FromRequestParts<S> for VoucherIdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let raw = path_segment(parts, state).await?;
        voucher_id(&raw).map(Self)
    }
}

/// A voucher id as it stands in a path, or the `bad_request` that says why not.
pub fn voucher_id(raw: &str) -> Result<i64, ApiError> {
    parse_positive(raw).ok_or_else(|| {
        ApiError::BadRequest(format!("voucher id {raw:?} is not a positive integer"))
    })
}

/// The single `{id}` of a path, as an order id.
pub struct OrderIdPath(pub OrderId);

impl<S: Send + Sync> FromRequestParts<S> for OrderIdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let raw = path_segment(parts, state).await?;
        raw.parse().map(Self).map_err(|()| {
            ApiError::BadRequest(format!("order id {raw:?} is not a positive 64-bit integer"))
        })
    }
}

async fn path_segment<S: Send + Sync>(parts: &mut Parts, state: &S) -> Result<String, ApiError> {
    Path::<String>::from_request_parts(parts, state)
        .await
        .map(|Path(raw)| raw)
        .map_err(|rejection| ApiError::BadRequest(rejection.body_text()))
}

/// The token after `Bearer ` in the Authorization header, if any.
fn bearer(parts: &Parts) -> Result<&str, &'static str> {
    let value = parts
        .headers
        .get(header::AUTHORIZATION)
        .ok_or("missing Authorization header")?;
    let value = value
        .to_str()
        .map_err(|_| "the Authorization header is not ASCII")?;
    let (scheme, token) = value
        .split_once(' ')
        .ok_or("expected `Authorization: Bearer <token>`")?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() || token.contains(' ') {
        return Err("expected `Authorization: Bearer <token>`");
    }
    Ok(token)
}

fn is_admin(parts: &Parts, state: &AppState) -> bool {
    match (&state.admin_token, bearer(parts)) {
        (Some(expected), Ok(token)) => bool::from(expected.as_bytes().ct_eq(token.as_bytes())),
        _ => false,
    }
}

/// A caller holding the admin token.
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if is_admin(parts, state) {
            Ok(Self)
        } else {
            Err(ApiError::Forbidden)
        }
    }
}

/// A signed-in user, by the id in a valid token.
pub struct User(pub i64);

impl FromRequestParts<AppState> for User {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer(parts).map_err(|why| ApiError::Unauthorized(why.into()))?;
        state
            .tokens
            .verify(token, chrono::Utc::now().timestamp())
            .map(Self)
            .map_err(|e| ApiError::Unauthorized(e.to_string()))
    }
}

/// Either the admin or a signed-in user.
pub enum Caller {
    Admin,
    User(i64),
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if is_admin(parts, state) {
            return Ok(Self::Admin);
        }
        User::from_request_parts(parts, state)
            .await
            .map(|User(id)| Self::User(id))
    }
}
