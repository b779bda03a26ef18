//! The storefront and the sale monitor: plain HTML, CSS and JavaScript
//! built into the binary (the files beside this one, in `shop/`), served
//! from memory as they are and gzipped once, with an `ETag` and
//! `Cache-Control`; no build step, nothing from another host, working
//! offline. The pages talk to the API only (`GET /vouchers`, the queue,
//! the purchase, the orders, `/demo/*`, the monitor's admin route).

use std::sync::LazyLock;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::extract::Segment;
use super::state::AppState;

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// The scripts and the style sheet, by the name they are served under
/// (`/shop/assets/<name>`).
const ASSETS: [(&str, &str, &str); 4] = [
    ("api.js", JS, include_str!("shop/api.js")),
    ("shop.js", JS, include_str!("shop/shop.js")),
    ("monitor.js", JS, include_str!("shop/monitor.js")),
    ("shop.css", CSS, include_str!("shop/shop.css")),
];

const BUYER_PAGE: &str = include_str!("shop/index.html");
const MONITOR_PAGE: &str = include_str!("shop/monitor.html");

/// Nothing but this origin: the pages load no script, style, font or
/// image from another host, and are framed by none.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; img-src 'self' data:; \
     object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// A file as served: its bytes, gzipped once, and its tag.
struct Served {
    content_type: &'static str,
    raw: Bytes,
    gzip: Bytes,
    etag: HeaderValue,
}

impl Served {
    fn new(content_type: &'static str, text: String) -> Self {
        let raw = Bytes::from(text);
        let digest = Sha256::digest(&raw);
        let etag = format!("\"{}\"", hex::encode(&digest[..12]));
        Self {
            content_type,
            gzip: Bytes::from(gzip(&raw)),
            raw,
            etag: HeaderValue::from_str(&etag).expect("a hex tag is a header value"),
        }
    }

    /// The file for a request with `headers`: `304` to its own tag, gzipped
    /// where the client takes it, cached as `cache_control` says.
    fn answer(&self, headers: &HeaderMap, cache_control: &'static str, page: bool) -> Response {
        let fresh = headers
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .any(|tag| tag.trim().trim_start_matches("W/") == self.etag);
        let mut response = if fresh {
            StatusCode::NOT_MODIFIED.into_response()
        } else if takes_gzip(headers) {
            let mut response = self.gzip.clone().into_response();
            response
                .headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            response
        } else {
            self.raw.clone().into_response()
        };
        let out = response.headers_mut();
        out.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(self.content_type),
        );
        out.insert(header::ETAG, self.etag.clone());
        out.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static(cache_control),
        );
        out.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        out.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        if page {
            out.insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONTENT_SECURITY_POLICY),
            );
            out.insert(
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            );
        }
        response
    }
}

fn gzip(raw: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder
        .write_all(raw)
        .and_then(|()| encoder.finish())
        .expect("gzip into memory cannot fail")
}

/// Whether `Accept-Encoding` takes gzip (and does not refuse it with
/// `q=0`).
fn takes_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|coding| {
            let name = coding.split(';').next().unwrap_or("").trim();
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refuses(coding)
        })
}

/// `q=0`, `q=0.0`, `q=0.000`: a coding the client refuses.
fn refuses(coding: &str) -> bool {
    coding.split(';').skip(1).any(|part| {
        part.trim()
            .strip_prefix("q=")
            .and_then(|q| q.trim().parse::<f32>().ok())
            .is_some_and(|q| q == 0.0)
    })
}

/// Every file, ready: the assets, and the pages with the assets' version
/// in their links (so that an asset is cached for good under its version)
/// and whether this is a demo.
struct Files {
    version: String,
    assets: Vec<(&'static str, Served)>,
    buyer: [Served; 2],
    monitor: Served,
}

static FILES: LazyLock<Files> = LazyLock::new(|| {
    let mut all = Sha256::new();
    for (name, _, text) in ASSETS {
        all.update(name.as_bytes());
        all.update(text.as_bytes());
    }
    let version = hex::encode(&all.finalize()[..8]);
    let page = |text: &str, demo: bool| {
        Served::new(
            HTML,
            text.replace("{{version}}", &version)
                .replace("{{demo}}", if demo { "true" } else { "false" }),
        )
    };
    Files {
        assets: ASSETS
            .iter()
            .map(|(name, kind, text)| (*name, Served::new(kind, (*text).to_owned())))
            .collect(),
        buyer: [page(BUYER_PAGE, false), page(BUYER_PAGE, true)],
        monitor: page(MONITOR_PAGE, false),
        version,
    }
});

/// Pages are asked again each time (`no-cache`: a `304` when unchanged),
/// so that a new binary's pages show at once.
const PAGE_CACHE: &str = "no-cache";

/// `/shop`: the storefront is `/shop/`.
pub(super) async fn shop_root() -> Redirect {
    Redirect::permanent("/shop/")
}

/// The buyer's page, at `/shop/` and `/shop/vouchers/{id}` (the page reads
/// the voucher from its address).
pub(super) async fn buyer(State(state): State<AppState>, headers: HeaderMap) -> Response {
    FILES.buyer[usize::from(state.demo)].answer(&headers, PAGE_CACHE, true)
}

/// The buyer's page for one voucher (the page reads which from its address).
pub(super) async fn buyer_voucher(state: State<AppState>, headers: HeaderMap) -> Response {
    buyer(state, headers).await
}

/// The sale monitor's page.
pub(super) async fn monitor(headers: HeaderMap) -> Response {
    FILES.monitor.answer(&headers, PAGE_CACHE, true)
}

#[derive(Deserialize)]
pub(super) struct AssetQuery {
    v: Option<String>,
}

/// A script or the style sheet. Asked for under the current version
/// (`?v=`), as the pages link it, it is cached for a year; otherwise
/// revalidated each time.
pub(super) async fn asset(
    Segment(name): Segment,
    query: Result<Query<AssetQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let query = match query {
        Ok(Query(query)) => query,
        Err(rejection) => return ApiError::BadRequest(rejection.body_text()).into_response(),
    };
    let files = &*FILES;
    let Some((_, served)) = files.assets.iter().find(|(known, _)| *known == name) else {
        return ApiError::NotFound("no such file".into()).into_response();
    };
    let cache = if query.v.as_deref() == Some(files.version.as_str()) {
        "public, max-age=31536000, immutable"
    } else {
        PAGE_CACHE
    };
    served.answer(&headers, cache, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepting(value: &str) -> HeaderMap {
        crate::http::one_header(header::ACCEPT_ENCODING, value)
    }

    #[test]
    fn gzip_is_sent_where_the_client_takes_it() {
        assert!(takes_gzip(&accepting("gzip, deflate, br")));
        assert!(takes_gzip(&accepting("br;q=1.0, gzip;q=0.8")));
        assert!(takes_gzip(&accepting("*")));
        assert!(!takes_gzip(&accepting("gzip;q=0")));
        assert!(!takes_gzip(&accepting("gzip; q=0.000")));
        assert!(!takes_gzip(&accepting("br")));
        assert!(!takes_gzip(&HeaderMap::new()));
    }

    #[test]
    fn the_pages_link_every_asset_under_its_version_and_nothing_elsewhere() {
        let files = &*FILES;
        for page in files.buyer.iter().chain([&files.monitor]) {
            let text = std::str::from_utf8(&page.raw).unwrap();
            assert!(!text.contains("{{"), "a placeholder left: {text}");
            assert!(!text.contains("http://") && !text.contains("https://"));
            for link in text.split("/shop/assets/").skip(1) {
                let name = link.split('?').next().unwrap();
                assert!(ASSETS.iter().any(|(known, _, _)| *known == name), "{name}");
                assert!(link.contains(&format!("?v={}", files.version)), "{link}");
            }
        }
        for (name, _, text) in ASSETS {
            // SVG's namespace is a name, not an address anything loads.
            let text = text.replace("http://www.w3.org/2000/svg", "");
            assert!(
                !text.contains("http://") && !text.contains("https://"),
                "{name}"
            );
        }
    }
}
