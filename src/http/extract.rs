//! Extractors that turn a request into typed values or the app's own
//! 4xx errors: JSON bodies, ids in paths, and who is calling.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode, Version};
use serde::de::DeserializeOwned;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use crate::auth::{AuthError, Authenticator};
use crate::domain::{parse_positive, OrderId};
use crate::domain::{UserId, VoucherId};

/// A JSON body whose rejections are the app's `bad_request` errors.
pub struct AppJson<T>(pub T);

impl<S, T> FromRequest<S> for AppJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let says_json =
            header_text(req.headers(), header::CONTENT_TYPE.as_str()).is_some_and(is_json_type);
        let body = Bytes::from_request(req, state)
            .await
            .map_err(body_rejection)?;
        if !says_json {
            return Err(ApiError::BadRequest(
                "Expected request with `Content-Type: application/json`".into(),
            ));
        }
        from_object(&body).map(Self)
    }
}

/// Whether a content type is JSON's: `application/json` or
/// `application/<anything>+json`, parameters aside.
fn is_json_type(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    let Some(subtype) = essence
        .get(..12)
        .filter(|kind| kind.eq_ignore_ascii_case("application/"))
        .and_then(|_| essence.get(12..))
    else {
        return false;
    };
    subtype.eq_ignore_ascii_case("json")
        || (subtype.len() > 5 && subtype[subtype.len() - 5..].eq_ignore_ascii_case("+json"))
}

/// A body read as JSON, as `T`, straight from its bytes: a key given twice
/// is refused (read through a `serde_json::Value`, the last one won
/// unseen: `{"quantity": 3, "quantity": 1}` bought one unit). serde reads
/// a struct from an array too (`[2]` as `{"add": 2}`): every body of this
/// API is an object, so nothing else is.
pub fn from_object<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().find(|b| !is_json_space(b)) != Some(&b'{') {
        return Err(ApiError::BadRequest(
            "the body must be a JSON object".into(),
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("invalid body: {}", said(&e))))
}

/// What a JSON error says: where it is for a body that is not JSON, just
/// what is wrong for a field (a body is one line; "at line 1 column 6"
/// adds nothing to "unknown field `qty`").
fn said(error: &serde_json::Error) -> String {
    let text = error.to_string();
    if error.classify() != serde_json::error::Category::Data {
        return text;
    }
    let at = format!(" at line {} column {}", error.line(), error.column());
    match text.strip_suffix(&at) {
        Some(what) => what.to_owned(),
        None => text,
    }
}

/// JSON's whitespace.
fn is_json_space(b: &u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// A body that axum could not take, from its rejection's status and text:
/// over the limit (`413`), else a `bad_request`.
fn unread(status: StatusCode, text: String) -> ApiError {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge(text)
    } else {
        ApiError::BadRequest(text)
    }
}

/// A request without a body, for routes that take none: a body is refused
/// (`400`), not silently ignored, and one over the limit is `413`. An
/// empty JSON object says nothing either, and is taken as none (clients
/// that send `{}` with every POST).
pub struct NoBody;

impl<S: Send + Sync> FromRequest<S> for NoBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match body_if_any(req, state).await? {
            None => Ok(Self),
            Some(body) if is_empty_object(&body) => Ok(Self),
            Some(_) => Err(ApiError::BadRequest("this route takes no body".into())),
        }
    }
}

/// Whether `body` is `{}`, JSON whitespace allowed (read as bytes: a large
/// body is not parsed to be refused).
fn is_empty_object(body: &[u8]) -> bool {
    let mut bytes = body.iter().filter(|b| !is_json_space(b));
    bytes.next() == Some(&b'{') && bytes.next() == Some(&b'}') && bytes.next().is_none()
}

/// The request's body, or `None` when it has none (or an empty one). The
/// usual case, an HTTP/1 request whose head says it has no body
/// (`Content-Length: 0`, or neither a length nor a transfer coding), is
/// known without reading one: hyper frames the body by these same headers.
async fn body_if_any<S: Send + Sync>(req: Request, state: &S) -> Result<Option<Bytes>, ApiError> {
    if req.version() <= Version::HTTP_11 && says_no_body(req.headers()) {
        return Ok(None);
    }
    let body = Bytes::from_request(req, state)
        .await
        .map_err(body_rejection)?;
    Ok((!body.is_empty()).then_some(body))
}

/// A body that may be absent: `None` for no body (or an empty one), else
/// the JSON object as `T` (`400` for anything else, `413` over the limit).
/// Its content type is not asked for: `curl -d` sends a form's.
pub struct MaybeJson<T>(pub Option<T>);

impl<S, T> FromRequest<S> for MaybeJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let Some(body) = body_if_any(req, state).await? else {
            return Ok(Self(None));
        };
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(None));
        }
        from_object(&body).map(|body| Self(Some(body)))
    }
}

/// A body that could not be read: over the limit (`413`) or cut short.
fn body_rejection(rejection: BytesRejection) -> ApiError {
    unread(rejection.status(), rejection.body_text())
}

/// Whether an HTTP/1 request's head says it carries no body.
pub(super) fn says_no_body(headers: &HeaderMap) -> bool {
    match headers.get(header::CONTENT_LENGTH) {
        Some(length) => length.as_bytes() == b"0",
        None => !headers.contains_key(header::TRANSFER_ENCODING),
    }
}

/// A header's value as text, if it is there and is text.
pub fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// The single `{id}` of a path, as a voucher id.
pub struct VoucherIdPath(pub VoucherId);

impl<S: Send + Sync> FromRequestParts<S> for VoucherIdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let raw = path_segment(parts, state).await?;
        voucher_id(&raw).map(Self)
    }
}

/// A voucher id as it stands in a path, or the `bad_request` that says why not.
pub fn voucher_id(raw: &str) -> Result<VoucherId, ApiError> {
    parse_positive(raw).and_then(VoucherId::new).ok_or_else(|| {
        ApiError::BadRequest(format!("voucher id {raw:?} is not a positive integer"))
    })
}

/// The single `{id}` of a path, as an order id.
pub struct OrderIdPath(pub OrderId);

impl<S: Send + Sync> FromRequestParts<S> for OrderIdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let raw = path_segment(parts, state).await?;
        raw.parse()
            .map(Self)
            .map_err(|_: crate::domain::NotAnOrderId| {
                // Written as the description's pattern allows, but past 2^63:
                // no order has it.
                if raw.len() <= 19
                    && !raw.starts_with('0')
                    && raw.bytes().all(|b| b.is_ascii_digit())
                {
                    ApiError::NotFound("order not found".into())
                } else {
                    ApiError::BadRequest(format!(
                        "order id {raw:?} is not a positive 64-bit integer"
                    ))
                }
            })
    }
}

/// The single segment a path captures (a file's name), or the JSON
/// `bad_request` that says why it cannot be read (not UTF-8 once decoded).
pub struct Segment(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Segment {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        path_segment(parts, state).await.map(Self)
    }
}

async fn path_segment<S: Send + Sync>(parts: &mut Parts, state: &S) -> Result<String, ApiError> {
    Path::<String>::from_request_parts(parts, state)
        .await
        .map(|Path(raw)| raw)
        .map_err(|rejection| ApiError::BadRequest(rejection.body_text()))
}

/// The longest bearer token read: a JWT with a few claims is under 1 KB,
/// and a longer one is not hashed, decoded and parsed to be refused.
const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// The token after `Bearer ` in the Authorization header, if any.
pub(super) fn bearer(headers: &HeaderMap) -> Result<&str, &'static str> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or("missing Authorization header")?;
    if value.len() > MAX_TOKEN_BYTES + "Bearer ".len() {
        return Err("the bearer token is over 8 KiB");
    }
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

/// What the extractors need of a router's state: the admin token, and who
/// a bearer token signs in. The service's state has both; a router of its
/// own (a mounted crate's) is handed the same.
pub trait SignIn: Send + Sync {
    /// `None`: no admin token is configured, and nobody is the admin.
    fn admin_token(&self) -> Option<&AdminToken>;
    fn authenticator(&self) -> &Authenticator;
}

fn is_admin(parts: &Parts, state: &impl SignIn) -> bool {
    match (state.admin_token(), bearer(&parts.headers)) {
        (Some(expected), Ok(token)) => expected.matches(token),
        _ => false,
    }
}

/// The admin token, kept as its SHA-256: a comparison then takes the same
/// time whatever the length or the first wrong byte of what was sent.
pub struct AdminToken([u8; 32]);

impl AdminToken {
    pub fn new(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    fn matches(&self, sent: &str) -> bool {
        let sent: [u8; 32] = Sha256::digest(sent.as_bytes()).into();
        bool::from(self.0.ct_eq(&sent))
    }
}

/// A caller holding the admin token.
pub struct Admin;

impl<S: SignIn> FromRequestParts<S> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        if is_admin(parts, state) {
            Ok(Self)
        } else {
            Err(ApiError::Forbidden)
        }
    }
}

/// What the limiter's verification of the request's token came to (the
/// user, or why not): the extractor takes it from here instead of checking
/// the token again (a refused token would be refused twice, and an unknown
/// `kid` wait twice for the JWK Set).
#[derive(Debug, Clone)]
pub struct Verification(pub Result<UserId, AuthError>);

/// A signed-in user, by the id in a valid token.
pub struct User(pub UserId);

impl<S: SignIn> FromRequestParts<S> for User {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        if let Some(Verification(verified)) = parts.extensions.get::<Verification>() {
            return verified.clone().map(Self).map_err(ApiError::from);
        }
        let token = bearer(&parts.headers).map_err(|why| ApiError::Unauthorized(why.into()))?;
        state
            .authenticator()
            .verify(token, chrono::Utc::now().timestamp())
            .await
            .map(Self)
            .map_err(ApiError::from)
    }
}

/// Either the admin or a signed-in user.
pub enum Caller {
    Admin,
    User(UserId),
}

impl<S: SignIn> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        if is_admin(parts, state) {
            return Ok(Self::Admin);
        }
        User::from_request_parts(parts, state)
            .await
            .map(|User(id)| Self::User(id))
    }
}

#[cfg(test)]
mod tests {
    use super::{is_empty_object, says_no_body, AdminToken};

    #[test]
    fn only_an_empty_json_object_counts_as_no_body() {
        for empty in ["{}", " { } ", "\n{\r\n}\t"] {
            assert!(is_empty_object(empty.as_bytes()), "{empty:?}");
        }
        for other in [
            "{\"a\":1}",
            "[]",
            "{}{}",
            "{",
            "}",
            "x",
            "{ x }",
            "\u{a0}{}",
        ] {
            assert!(!is_empty_object(other.as_bytes()), "{other:?}");
        }
    }

    #[test]
    fn the_admin_token_matches_itself_only() {
        let token = AdminToken::new("a-long-random-admin-token-0123456789");
        assert!(token.matches("a-long-random-admin-token-0123456789"));
        assert!(!token.matches("a-long-random-admin-token-012345678"));
        assert!(!token.matches(""));
        assert!(!token.matches("x"));
    }
    use axum::http::{header, HeaderMap, HeaderValue};

    #[test]
    fn a_head_without_a_length_or_a_coding_or_with_length_0_says_no_body() {
        let head = |pairs: &[(header::HeaderName, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(name, HeaderValue::from_static(value));
            }
            says_no_body(&headers)
        };
        assert!(head(&[]));
        assert!(head(&[(header::CONTENT_LENGTH, "0")]));
        assert!(!head(&[(header::CONTENT_LENGTH, "6")]));
        assert!(
            !head(&[(header::CONTENT_LENGTH, "00")]),
            "read, then judged"
        );
        assert!(!head(&[(header::TRANSFER_ENCODING, "chunked")]));
    }
}
