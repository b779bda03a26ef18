//! The API's description, generated from the handlers' annotations of the
//! route table (`routes.rs`) and served at `/openapi.json` (OpenAPI 3.1),
//! and the reference page that
//! renders it at `/docs`: Swagger UI, whose files come inside a registry
//! package at build time and are served from the binary, so the page works
//! with no network.

use std::sync::{Arc, OnceLock};

use axum::body::Bytes;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Extension;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_swagger_ui::Config;

use super::error::ApiError;
use super::extract::Segment;
use super::responses::error_response;
use crate::domain::{OrderStatus, SaleMode};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "seckill",
        description = "A flash-sale backend that never oversells. Every error is \
                       `{\"error\": \"<code>\", \"message\": \"<text>\"}`; order ids travel \
                       as decimal strings (they exceed 2^53).",
        license(name = "MIT OR Apache-2.0")
    ),
    tags(
        (name = "sale", description = "Vouchers, purchases and orders"),
        (name = "orders", description = "After the grab: pay before the deadline (the provider's signed notification), or cancel"),
        (name = "admin", description = "Needs the admin token (SECKILL_ADMIN_TOKEN)"),
        (name = "ops", description = "Liveness, readiness and metrics"),
        (name = "demo", description = "Only with `serve --demo` (else 404): users for the storefront's sign-in, and the demo payment provider"),
    )
)]
struct ApiDoc;

/// The two bearer tokens: the admin's, and a user's signed token.
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("The admin token (SECKILL_ADMIN_TOKEN)"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "user",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("v1.<user_id>.<expires_unix>.<HMAC-SHA256>, or a JWT")
                    .description(Some(
                        "A user token minted by POST /admin/tokens, or the shop's JWT \
                         (SECKILL_JWT_JWKS or SECKILL_JWT_HS256_SECRET; its sub is the user)",
                    ))
                    .build(),
            ),
        );
    }
}

/// Every route may answer `429 rate_limited` (the client address's limit
/// covers them all): said once here rather than on every handler.
struct RateLimited;

impl Modify for RateLimited {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let limited = error_response(
            "rate_limited: the client address (or, on user routes, the user) is over its \
             limit; Retry-After says when to come back",
        );
        describe_where_missing(openapi, "429", &limited, |_| true);
    }
}

/// `503 unavailable` on every route the shedder may refuse (all but the
/// probes), where the route does not describe its own.
fn describe_shedding(openapi: &mut utoipa::openapi::OpenApi, sheddable: impl Fn(&str) -> bool) {
    let shed = error_response(
        "unavailable: the instance is saturated and sheds this route's class (least \
         critical first), or a dependency is away; Retry-After says when to come back",
    );
    describe_where_missing(openapi, "503", &shed, sheddable);
}

/// Adds `response` as `status` to every operation of the paths `applies`
/// to that does not describe that status itself.
fn describe_where_missing(
    openapi: &mut utoipa::openapi::OpenApi,
    status: &str,
    response: &utoipa::openapi::Response,
    applies: impl Fn(&str) -> bool,
) {
    for (path, operation) in operations(openapi) {
        if applies(path) {
            add_where_missing(operation, status, response);
        }
    }
}

fn add_where_missing(
    operation: &mut Operation,
    status: &str,
    response: &utoipa::openapi::Response,
) {
    operation
        .responses
        .responses
        .entry(status.to_owned())
        .or_insert_with(|| response.clone().into());
}

/// Every operation of the description, with its path.
fn operations(
    openapi: &mut utoipa::openapi::OpenApi,
) -> impl Iterator<Item = (&str, &mut Operation)> {
    openapi.paths.paths.iter_mut().flat_map(|(path, item)| {
        [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        .map(move |operation| (path.as_str(), operation))
    })
}

/// What every admin route (the route table's admin class) shares, said
/// once: its tag, the admin token, and the refusals each may give (a
/// malformed request, no or a wrong admin token, a body too large) where
/// the route does not describe its own.
pub(super) fn describe_admin(paths: &mut utoipa::openapi::OpenApi) {
    let refusals = [
        ("400", "bad_request: a malformed id, query or body"),
        (
            "403",
            "forbidden: no admin token, or not the configured one",
        ),
        ("413", "payload_too_large"),
    ]
    .map(|(status, description)| (status, error_response(description)));
    for (_, operation) in operations(paths) {
        operation.tags = Some(vec!["admin".to_owned()]);
        operation.security = Some(vec![SecurityRequirement::new(
            "admin",
            Vec::<String>::new(),
        )]);
        for (status, response) in &refusals {
            add_where_missing(operation, status, response);
        }
    }
}

/// The whole description: `paths` (the route table's, from the handlers'
/// annotations) under the API's title, tags and security schemes, with the
/// refusals every route may give; `sheddable` says which paths the shedder
/// may refuse.
pub(super) fn document(
    paths: utoipa::openapi::OpenApi,
    sheddable: impl Fn(&str) -> bool,
) -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.merge(paths);
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    Security.modify(&mut doc);
    RateLimited.modify(&mut doc);
    describe_shedding(&mut doc, sheddable);
    doc
}

/// The description as served, serialized once when the routes are built.
#[derive(Clone)]
pub(super) struct DocumentJson(pub(super) Bytes);

pub(super) async fn openapi_json(
    Extension(DocumentJson(json)): Extension<DocumentJson>,
) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], json).into_response()
}

fn swagger_config() -> Arc<Config<'static>> {
    static CONFIG: OnceLock<Arc<Config<'static>>> = OnceLock::new();
    CONFIG
        .get_or_init(|| Arc::new(Config::from("/openapi.json")))
        .clone()
}

/// The reference page itself, at `/docs` (its files under `/docs/`).
pub(super) async fn docs() -> Response {
    match utoipa_swagger_ui::serve("index.html", swagger_config()) {
        Ok(Some(file)) => {
            let page = String::from_utf8_lossy(&file.bytes).replacen(
                "<head>",
                "<head>\n    <base href=\"/docs/\">",
                1,
            );
            Html(page).into_response()
        }
        _ => ApiError::NotFound("the API page is not built in".into()).into_response(),
    }
}

/// A file of the reference page.
pub(super) async fn docs_file(Segment(file): Segment) -> Response {
    match utoipa_swagger_ui::serve(&file, swagger_config()) {
        Ok(Some(found)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, found.content_type)],
            found.bytes.into_owned(),
        )
            .into_response(),
        _ => ApiError::NotFound("no such file".into()).into_response(),
    }
}

/// A domain state as the API shows it: a string, one of its words (the
/// domain types carry no HTTP concern; their schemas are written here).
fn word_schema(
    description: &str,
    words: impl IntoIterator<Item = &'static str>,
) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .description(Some(description))
        .enum_values(Some(words))
        .into()
}

impl utoipa::PartialSchema for SaleMode {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        word_schema(
            "How a voucher is sold: sync (the order is committed before the buyer hears 200) \
             or async (Redis accepts it, 202 pending, and the stream writers commit it)",
            SaleMode::ALL.iter().map(|mode| mode.as_str()),
        )
    }
}

impl utoipa::ToSchema for SaleMode {}

impl utoipa::PartialSchema for OrderStatus {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        word_schema(
            "Where an order stands: pending (accepted by an async sale, not stored yet), \
             unpaid, paid, cancelled or expired",
            OrderStatus::ALL.iter().map(|status| status.as_str()),
        )
    }
}

impl utoipa::ToSchema for OrderStatus {}
