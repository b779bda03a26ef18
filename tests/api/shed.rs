//! Shedding by criticality, wired end to end: an instance whose target
//! delay every probe exceeds refuses its classes from the least critical
//! up, each `503 unavailable` held and carrying `Retry-After`, and never
//! sheds `/healthz`, `/readyz` or `/metrics`.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::helpers::{answer, poll_until, spawn_app_with};

/// The value of the metrics line that starts with `series`.
fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test]
async fn a_saturated_instance_sheds_every_class_each_refusal_held_but_never_its_probes_of_life() {
    // A target of a microsecond: every probe is over it (and over every
    // class's multiple of it), so the instance counts as saturated.
    let app = spawn_app_with(|mut s| {
        s.shed_delay = Duration::from_micros(1);
        s.limit_delay = Duration::from_millis(200);
        s
    })
    .await;
    let page = poll_until(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "every class refused whole",
        || app.metrics(),
        |page| {
            ["reads", "admin", "orders", "sale"].iter().all(|class| {
                metric(
                    page,
                    &format!("seckill_shed_refused_share{{class=\"{class}\"}}"),
                ) == Some(1.0)
            })
        },
    )
    .await;
    assert!(metric(&page, "seckill_shed_delay_seconds").is_some_and(|d| d > 0.0));

    let started = Instant::now();
    let response = app.client.get(app.url("/vouchers/1")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "a refusal is held: {:?}",
        started.elapsed()
    );
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"], "unavailable");
    let (status, body) = answer(app.client.post(app.url("/seckill/1")).bearer_auth("x")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable"))
    );

    // The probes answer: a load balancer reading a refused `/readyz` would
    // take this busy, healthy instance out of its pool.
    for probe in ["/healthz", "/readyz"] {
        let status = app
            .client
            .get(app.url(probe))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, StatusCode::OK, "{probe}");
    }
    let page = app.metrics().await;
    for class in ["reads", "sale"] {
        let refused = metric(
            &page,
            &format!("seckill_shed_refused_total{{class=\"{class}\"}}"),
        );
        assert!(refused.is_some_and(|n| n >= 1.0), "{class}: {refused:?}");
    }
    assert!(metric(&page, "seckill_shed_admitted_total{class=\"reads\"}").is_some());
}
