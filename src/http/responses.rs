//! How the routes' answers and parameters are described in the OpenAPI
//! document: the refusals each handler lists by name, and the path
//! parameters its extractors read. A leaf: the handlers and the document
//! import it, it imports neither.

use std::collections::BTreeMap;

use utoipa::openapi::RefOr;

/// An error answer: its description and the error body.
pub(super) fn error_response(description: &str) -> utoipa::openapi::Response {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
}

/// The refusals whose description says no more than their code, each
/// named once here and listed by name in the handlers' `responses(...)`.
macro_rules! plain_refusals {
    ($($name:ident = $status:literal, $code:literal;)+) => {$(
        #[doc = concat!("`", $status, " ", $code, "`.")]
        pub struct $name;

        impl utoipa::IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
                BTreeMap::from([($status.to_string(), error_response($code).into())])
            }
        }
    )+};
}

plain_refusals! {
    BadRequest = 400, "bad_request";
    Unauthorized = 401, "unauthorized";
    NotFound = 404, "not_found";
    OrderNotFound = 404, "not_found: no such order, or another user's";
    RoomNotFound = 404, "not_found: no such voucher, or it has no waiting room";
    TooLarge = 413, "payload_too_large";
    Unavailable = 503, "unavailable";
}

/// One path parameter, required, as the routes' extractors read it.
fn path_param(
    name: &str,
    description: &str,
    schema: utoipa::openapi::ObjectBuilder,
) -> Vec<utoipa::openapi::path::Parameter> {
    use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
    vec![ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Path)
        .required(utoipa::openapi::Required::True)
        .description(Some(description))
        .schema(Some(schema))
        .build()]
}

/// The `{id}` of a voucher's routes, described once.
impl utoipa::IntoParams for super::extract::VoucherIdPath {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        use utoipa::openapi::schema::{KnownFormat, SchemaFormat, Type};
        let id = utoipa::openapi::ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(1));
        path_param("id", "The voucher id", id)
    }
}

/// The `{order_id}` of an order's routes: decimal, as order ids travel.
impl utoipa::IntoParams for super::extract::OrderIdPath {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        let id = utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some("^[1-9][0-9]{0,18}$"));
        path_param("order_id", "The order id, in decimal", id)
    }
}
