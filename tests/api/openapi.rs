//! The API's description at `/openapi.json` and its reference page at
//! `/docs`: every route and error of the contract is described, and the
//! page renders in a real browser with no network.

use std::collections::BTreeSet;

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{answer, spawn_app};

/// Every (method, path) the router serves for clients, as the contract has
/// them.
const OPERATIONS: [(&str, &str); 23] = [
    ("post", "/admin/vouchers"),
    ("get", "/vouchers"),
    ("get", "/vouchers/{id}"),
    ("post", "/vouchers/{id}/queue"),
    ("get", "/vouchers/{id}/queue"),
    ("post", "/admin/tokens"),
    ("post", "/seckill/{voucher_id}"),
    ("get", "/orders/{order_id}"),
    ("post", "/orders/{order_id}/cancel"),
    ("post", "/payments/notify"),
    ("get", "/admin/vouchers/{id}/orders"),
    ("post", "/admin/vouchers/{id}/stock"),
    ("post", "/admin/vouchers/{id}/reconcile"),
    ("get", "/admin/vouchers/{id}/stats"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/admin/events"),
    ("get", "/admin/webhooks/failed"),
    ("post", "/admin/webhooks/retry"),
    ("get", "/admin/vouchers/{id}/monitor"),
    ("post", "/demo/users"),
    ("post", "/demo/orders/{order_id}/pay"),
];

#[tokio::test]
async fn openapi_json_describes_every_route_status_and_error_code() {
    let app = spawn_app().await;
    let response = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let doc: Value = response.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    // Every route the shedder may refuse says so; its probes of life never.
    for (method, path) in OPERATIONS {
        let shed = doc["paths"][path][method]["responses"].get("503").is_some();
        let never_shed = path == "/healthz" || path == "/metrics";
        assert_eq!(shed, !never_shed, "{method} {path}: 503 described");
    }

    let described: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |method| (method.clone(), path.clone()))
        })
        .collect();
    let expected: BTreeSet<(String, String)> = OPERATIONS
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(described, expected);

    for (method, path) in OPERATIONS {
        let op = &doc["paths"][path][method];
        let statuses: BTreeSet<&str> = op["responses"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let secured = op["security"].as_array().is_some_and(|s| !s.is_empty());
        if path.starts_with("/admin") {
            assert!(statuses.contains("403"), "{method} {path}: no 403");
        }
        if path == "/seckill/{voucher_id}" {
            for status in [
                "200", "202", "400", "401", "403", "404", "409", "413", "429", "503",
            ] {
                assert!(statuses.contains(status), "{method} {path}: no {status}");
            }
        }
        if path == "/payments/notify" {
            for status in ["200", "400", "401", "403", "404", "409", "503"] {
                assert!(statuses.contains(status), "{method} {path}: no {status}");
            }
        }
        if secured {
            assert!(
                statuses.contains("401") || statuses.contains("403"),
                "{method} {path}: secured without 401 or 403"
            );
        }
        assert!(!statuses.contains("500"), "{method} {path} promises a 500");
        // The client address's limit covers every route.
        assert!(statuses.contains("429"), "{method} {path}: no 429");
    }

    let codes: BTreeSet<&str> = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    for code in [
        "bad_request",
        "unauthorized",
        "forbidden",
        "not_found",
        "method_not_allowed",
        "payload_too_large",
        "not_started",
        "ended",
        "sold_out",
        "already_purchased",
        "already_paid",
        "order_expired",
        "order_pending",
        "purchase_in_progress",
        "unavailable",
        "not_admitted",
        "too_many_orders",
        "payment_conflict",
        "rate_limited",
    ] {
        assert!(codes.contains(code), "no error code {code}");
    }
    let schemes = doc["components"]["securitySchemes"].as_object().unwrap();
    assert!(schemes.contains_key("admin") && schemes.contains_key("user"));
}

/// The pattern or bounds the description gives the parameter named `name`
/// of the operation at `path`, `method`.
fn parameter_schema<'d>(doc: &'d Value, method: &str, path: &str, name: &str) -> &'d Value {
    doc["paths"][path][method]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .map(|p| &p["schema"])
        .unwrap_or_else(|| panic!("{method} {path} has no parameter {name}"))
}

#[tokio::test]
async fn values_the_description_allows_are_never_refused_as_malformed() {
    // What a fuzzer generating from the description sends as valid: the
    // edges of each pattern and bound are answered as such, not 400.
    let app = spawn_app().await;
    let (_, doc) = answer(app.client.get(app.url("/openapi.json"))).await;
    let order = parameter_schema(&doc, "get", "/orders/{order_id}", "order_id");
    assert_eq!(order["pattern"], "^[1-9][0-9]{0,18}$");
    // Nineteen nines fit the pattern and not an i64: no such order.
    let token = app.token(1).await;
    for path in ["/orders/9999999999999999999", "/orders/9223372036854775808"] {
        let (status, body) = app.get_as(path, &token).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_found")),
            "{path}: {body}"
        );
    }
    let (status, body) = app.get_as("/orders/99999999999999999999", &token).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "twenty digits: {body}");

    // An event id is two non-negative i64s in hex: the pattern says so.
    let after = parameter_schema(&doc, "get", "/admin/events", "after");
    assert_eq!(after["pattern"], "^[0-7][0-9a-f]{15}[0-7][0-9a-f]{15}$");
    let (status, body) = app
        .admin_get(&format!("/admin/events?after={}", "7f".repeat(16)))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The users to mint tokens for are positive.
    let minted = &doc["components"]["schemas"]["MintTokens"]["properties"]["user_ids"]["items"];
    let item = match minted["$ref"].as_str() {
        Some(reference) => &doc["components"]["schemas"][reference.rsplit('/').next().unwrap()],
        None => minted,
    };
    assert_eq!(item["minimum"], 1, "{minted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_page_shows_the_purchase_operation_in_a_browser_without_network_needs_chromium() {
    let app = spawn_app().await;
    let page = app.url("/docs");
    let profile = std::env::temp_dir().join(format!(
        "seckill-chromium-{}",
        uuid::Uuid::new_v4().simple()
    ));
    // Headless, with every request outside this service refused: the page
    // must need nothing from a CDN.
    let host = app.base.trim_start_matches("http://").to_owned();
    let dom = tokio::task::spawn_blocking(move || {
        let output = testkit::headless_chromium(&profile)
            .args(["--disable-quic", "--virtual-time-budget=15000"])
            .arg(format!(
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE {}",
                host.split(':').next().unwrap()
            ))
            .arg("--dump-dom")
            .arg(&page)
            .output()
            .expect("chromium runs");
        let _ = std::fs::remove_dir_all(&profile);
        String::from_utf8_lossy(&output.stdout).into_owned()
    })
    .await
    .unwrap();
    assert!(
        dom.contains("/seckill/{voucher_id}"),
        "the purchase operation is not on the page: {}",
        &dom[..dom.len().min(2_000)]
    );
    assert!(
        dom.contains("opblock"),
        "Swagger UI did not render its operations"
    );
}
