//! Reads a CDN or a proxy in front may keep for a moment: `Cache-Control`
//! (public, a second, and one more while it asks again), an `ETag` of
//! what the answer says, and `304 Not Modified` to a matching
//! `If-None-Match`, so that a flood of reads can be absorbed before it
//! reaches an instance, and a client that asks again is told "unchanged"
//! in a few bytes. Pages the instance renders for many at once are
//! rendered once for them: `GET /vouchers`' list ([`Listing`]) and
//! `/metrics` ([`MetricsPage`]).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::header::{CACHE_CONTROL, ETAG, IF_NONE_MATCH};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// How long a cache in front may serve an answer without asking (a
/// second), and how long after that it may still serve it while one
/// request asks (a second more, so that a flood waits for no one; and no
/// longer, so that a reader after a quiet spell gets a fresh one).
pub const CACHE_CONTROL_VALUE: &str = "public, max-age=1, stale-while-revalidate=1";

/// The answer to a cacheable read: `body` serialized, tagged by `tag` (the
/// body itself, or a weak tag of the part of it that changes what it
/// means: a list's server time changes every second, its vouchers do
/// not). `304` with no body when the request's `If-None-Match` names that
/// tag (a weak one is known before the body is written).
pub fn cacheable<B: Serialize>(request: &HeaderMap, body: &B, tag: Tag) -> Response {
    if let Tag::Weak(etag) = &tag {
        if matches(request, etag) {
            return not_modified(etag.clone());
        }
    }
    let bytes = match serde_json::to_vec(body) {
        Ok(bytes) => bytes,
        Err(error) => {
            return super::error::ApiError::Seckill(crate::seckill::SeckillError::internal(
                format!("serializing a read: {error}"),
            ))
            .into_response()
        }
    };
    let etag = match tag {
        Tag::Whole => {
            let etag = HeaderValue::from_str(&format!("\"{:016x}\"", digest(&bytes)))
                .expect("a quoted hex digest is a header value");
            if matches(request, &etag) {
                return not_modified(etag);
            }
            etag
        }
        Tag::Weak(etag) => etag,
    };
    let json = (
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    (caching(etag), [json], bytes).into_response()
}

/// The headers that let a cache keep an answer tagged `etag`.
fn caching(etag: HeaderValue) -> [(axum::http::HeaderName, HeaderValue); 2] {
    [
        (CACHE_CONTROL, HeaderValue::from_static(CACHE_CONTROL_VALUE)),
        (ETAG, etag),
    ]
}

fn not_modified(etag: HeaderValue) -> Response {
    (StatusCode::NOT_MODIFIED, caching(etag)).into_response()
}

/// How an answer is tagged.
pub enum Tag {
    /// By the whole body: a strong tag.
    Whole,
    /// By a part that decides what the body means: this weak tag.
    Weak(HeaderValue),
}

/// The weak tag of a part of a body, serialized as `part`.
pub fn weak_tag(part: &[u8]) -> HeaderValue {
    HeaderValue::from_str(&format!("W/\"{:016x}\"", digest(part)))
        .expect("a quoted hex digest is a header value")
}

/// The vouchers on offer as last rendered, for `GET /vouchers`: the list
/// (the very `Arc` the voucher cache hands out while it is current), its
/// JSON and its weak tag. A flood of list reads, or every open storefront
/// asking every two seconds, renders and hashes each list once, not once
/// per request.
#[derive(Default)]
pub struct Listing(std::sync::Mutex<Option<Rendered>>);

struct Rendered {
    listed: std::sync::Arc<[crate::domain::Voucher]>,
    json: Box<serde_json::value::RawValue>,
    etag: HeaderValue,
}

impl Listing {
    /// `listed` as `render` writes it, and its weak tag: rendered again
    /// only when the list is another.
    pub fn rendered<T: Serialize>(
        &self,
        listed: &std::sync::Arc<[crate::domain::Voucher]>,
        render: impl FnOnce(&[crate::domain::Voucher]) -> T,
    ) -> Result<(Box<serde_json::value::RawValue>, HeaderValue), serde_json::Error> {
        let mut last = self.0.lock().expect("the listing's lock is never poisoned");
        if let Some(done) = &*last {
            if std::sync::Arc::ptr_eq(&done.listed, listed) {
                return Ok((done.json.clone(), done.etag.clone()));
            }
        }
        let json = serde_json::value::to_raw_value(&render(listed))?;
        let etag = weak_tag(json.get().as_bytes());
        *last = Some(Rendered {
            listed: listed.clone(),
            json: json.clone(),
            etag: etag.clone(),
        });
        Ok((json, etag))
    }
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

/// `/metrics`' text, rendered for one request and shared by every request
/// that arrived before that render began (they see all that happened
/// before they asked): a render reads every series, about six `/healthz`
/// requests' CPU, and many scrapes at once need one. One render at a time.
#[derive(Default)]
pub struct MetricsPage(tokio::sync::Mutex<Option<(Instant, Bytes)>>);

impl MetricsPage {
    /// The page for a request that `arrived` then: the last render if it
    /// began after that, or, when this request had to queue behind another
    /// (a flood, not one scraper asking in turn), at most `stale_ok`
    /// before; else `render`'s.
    pub async fn text(
        &self,
        arrived: Instant,
        stale_ok: Duration,
        render: impl FnOnce() -> String,
    ) -> Bytes {
        let (mut last, stale_ok) = match self.0.try_lock() {
            Ok(last) => (last, Duration::ZERO),
            Err(_) => (self.0.lock().await, stale_ok),
        };
        if let Some((began, text)) = &*last {
            if *began + stale_ok >= arrived {
                return text.clone();
            }
        }
        let began = Instant::now();
        let text = Bytes::from(render());
        *last = Some((began, text.clone()));
        text
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

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
            let response = cacheable(&HeaderMap::new(), body, Tag::Whole);
            response.headers()[ETAG].clone()
        };
        let one = serde_json::json!({ "stock": 1 });
        assert_eq!(tag(&one), tag(&one.clone()));
        assert_ne!(tag(&one), tag(&serde_json::json!({ "stock": 2 })));
        let response = cacheable(&asking(tag(&one).to_str().unwrap()), &one, Tag::Whole);
        assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(response.headers()[CACHE_CONTROL], CACHE_CONTROL_VALUE);
    }

    #[test]
    fn a_list_is_rendered_once_and_another_list_again() {
        let listing = Listing::default();
        let one: std::sync::Arc<[crate::domain::Voucher]> = Vec::new().into();
        let (json, etag) = listing.rendered(&one, |_| vec![1]).unwrap();
        assert_eq!(json.get(), "[1]");
        assert_eq!(etag, weak_tag(b"[1]"));
        // The same list: not rendered again.
        let (again, tag) = listing
            .rendered(&one, |_| -> Vec<i32> { panic!("rendered twice") })
            .unwrap();
        assert_eq!((again.get(), tag), ("[1]", etag));
        // Another list (the cache's next): rendered.
        let other: std::sync::Arc<[crate::domain::Voucher]> = Vec::new().into();
        let (json, _) = listing.rendered(&other, |_| vec![2]).unwrap();
        assert_eq!(json.get(), "[2]");
    }

    /// A render that counts itself and says which it was.
    fn counted(renders: &AtomicUsize) -> impl FnOnce() -> String + '_ {
        || format!("render {}", renders.fetch_add(1, Ordering::SeqCst) + 1)
    }

    #[tokio::test]
    async fn a_render_serves_the_requests_that_arrived_before_it_began_and_no_later_one() {
        let page = MetricsPage::default();
        let renders = AtomicUsize::new(0);
        let (first, second) = (Instant::now(), Instant::now());
        let fresh = Duration::ZERO;
        assert_eq!(page.text(first, fresh, counted(&renders)).await, "render 1");
        // Arrived before render 1 began: it saw everything this one asked.
        assert_eq!(
            page.text(second, fresh, counted(&renders)).await,
            "render 1"
        );
        // Arrived after it began: rendered again.
        let later = Instant::now();
        assert_eq!(page.text(later, fresh, counted(&renders)).await, "render 2");
        assert_eq!(renders.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn while_the_instance_sheds_a_queued_request_takes_a_page_up_to_its_age_limit() {
        let page = std::sync::Arc::new(MetricsPage::default());
        let renders = AtomicUsize::new(0);
        let stale_ok = Duration::from_secs(1);
        assert_eq!(
            page.text(Instant::now(), stale_ok, counted(&renders)).await,
            "render 1"
        );
        // One scraper asking in turn queues behind nobody: fresh each time.
        assert_eq!(
            page.text(Instant::now(), stale_ok, counted(&renders)).await,
            "render 2"
        );
        // A request that queued behind another's render takes that render's
        // page, though it arrived after the render began.
        let held = page.0.lock().await;
        let queued = {
            let page = page.clone();
            tokio::spawn(async move {
                let renders = AtomicUsize::new(10);
                page.text(Instant::now(), stale_ok, counted(&renders)).await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(held);
        assert_eq!(queued.await.unwrap(), "render 2");
        // Older than allowed: rendered again, queued or not.
        let much_later = Instant::now() + Duration::from_secs(2);
        assert_eq!(
            page.text(much_later, stale_ok, counted(&renders)).await,
            "render 3"
        );
    }
}
