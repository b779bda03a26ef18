//! Reads a CDN or a proxy in front may keep for a moment: `Cache-Control`
//! (public, a second, and one more while it asks again), an `ETag` of
//! what the answer says, and `304 Not Modified` to a matching
//! `If-None-Match`, so that a flood of reads can be absorbed before it
//! reaches an instance, and a client that asks again is told "unchanged"
//! in a few bytes.

use std::hash::{DefaultHasher, Hash, Hasher};

use axum::http::header::{CACHE_CONTROL, ETAG, IF_NONE_MATCH};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// How long a cache in front may serve an answer without asking (a
/// second), and how long after that it may still serve it while one
/// request asks (a second more, so that a flood waits for no one; and no
/// longer, so that a reader after a quiet spell gets a fresh one).
pub const CACHE_CONTROL_VALUE: &str = "public, max-age=1, stale-while-revalidate=1";

/// The answer to a cacheable read: `body` serialized, its tag computed from
/// `tagged` (the body itself, or the part of it that changes what it means:
/// a list's server time changes every second, its vouchers do not), weak
/// when `tagged` is not the whole body. `304` with no body when the request's
/// `If-None-Match` names that tag.
pub fn cacheable<B, T>(request: &HeaderMap, body: &B, tagged: Tagged<'_, T>) -> Response
where
    B: Serialize,
    T: Serialize + ?Sized,
{
    let bytes = match serde_json::to_vec(body) {
        Ok(bytes) => bytes,
        Err(error) => {
            return super::error::ApiError::Seckill(crate::seckill::SeckillError::internal(
                format!("serializing a read: {error}"),
            ))
            .into_response()
        }
    };
    let etag = match tagged {
        Tagged::Whole => format!("\"{:016x}\"", digest(&bytes)),
        Tagged::Part(part) => {
            let part = serde_json::to_vec(part).unwrap_or_default();
            format!("W/\"{:016x}\"", digest(&part))
        }
    };
    let etag = HeaderValue::from_str(&etag).expect("a quoted hex digest is a header value");
    let headers = [
        (CACHE_CONTROL, HeaderValue::from_static(CACHE_CONTROL_VALUE)),
        (ETAG, etag.clone()),
    ];
    if matches(request, &etag) {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    let json = (
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    (headers, [json], bytes).into_response()
}

/// What an answer's tag is computed from.
pub enum Tagged<'a, T: ?Sized> {
    /// The whole body: a strong tag.
    Whole,
    /// A part that decides what the body means: a weak tag.
    Part(&'a T),
}

/// A 64-bit digest of `bytes`, the same on every instance of one build
/// (SipHash with fixed keys): instances behind one balancer agree on a tag.
fn digest(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// Whether `If-None-Match` names `etag` (or is `*`), compared weakly as
/// RFC 9110 says for that header: `W/"x"` matches `"x"`.
fn matches(request: &HeaderMap, etag: &HeaderValue) -> bool {
    let ours = opaque(etag.to_str().unwrap_or_default());
    request
        .get_all(IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .any(|theirs| theirs == "*" || opaque(theirs) == ours)
}

/// A tag without its weakness mark.
fn opaque(tag: &str) -> &str {
    tag.strip_prefix("W/").unwrap_or(tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asking(value: &str) -> HeaderMap {
        crate::http::one_header(IF_NONE_MATCH, value)
    }

    #[test]
    fn if_none_match_matches_a_listed_tag_weakly_or_a_star_and_nothing_else() {
        let ours = HeaderValue::from_static("\"00ff\"");
        assert!(matches(&asking("\"00ff\""), &ours));
        assert!(matches(&asking("W/\"00ff\""), &ours));
        assert!(matches(&asking("\"aa\", W/\"00ff\""), &ours));
        assert!(matches(&asking("*"), &ours));
        assert!(!matches(&asking("\"00fe\""), &ours));
        assert!(!matches(&asking("00ff"), &ours));
        assert!(!matches(&HeaderMap::new(), &ours));
        let weak = HeaderValue::from_static("W/\"00ff\"");
        assert!(matches(&asking("\"00ff\""), &weak));
    }

    #[test]
    fn the_same_body_gets_the_same_tag_and_another_body_another() {
        let tag = |body: &serde_json::Value| {
            let response = cacheable(&HeaderMap::new(), body, Tagged::<()>::Whole);
            response.headers()[ETAG].clone()
        };
        let one = serde_json::json!({ "stock": 1 });
        assert_eq!(tag(&one), tag(&one.clone()));
        assert_ne!(tag(&one), tag(&serde_json::json!({ "stock": 2 })));
        let response = cacheable(
            &asking(tag(&one).to_str().unwrap()),
            &one,
            Tagged::<()>::Whole,
        );
        assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(response.headers()[CACHE_CONTROL], CACHE_CONTROL_VALUE);
    }
}
