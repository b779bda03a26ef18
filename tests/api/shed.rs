//! Shedding by criticality, wired end to end: a busy instance whose
//! target delay every probe exceeds refuses its classes from the least
//! critical up, each `503 unavailable` held and carrying `Retry-After`, and
//! never sheds `/healthz`, `/readyz` or `/metrics`; an idle one, whatever
//! the delay, refuses nothing.

use std::time::{Duration, Instant};

use reqwest::StatusCode;

use crate::helpers::{answer, poll_until, spawn_app_with};

/// The value of the metrics line that starts with `series`.
fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Keeps the test's runtime (the instance's) busy until dropped: a task
/// that spins 5 ms at a time, as a flood of reads from memory would.
fn burner() -> tokio_util::task::AbortOnDropHandle<()> {
    tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async {
        loop {
            let spun = Instant::now();
            while spun.elapsed() < Duration::from_millis(5) {
                std::hint::spin_loop();
            }
            tokio::task::yield_now().await;
        }
    }))
}

#[tokio::test]
async fn a_saturated_instance_sheds_every_class_each_refusal_held_but_never_its_probes_of_life() {
    // A target of a microsecond: every probe is over it (and over every
    // class's multiple of it), and the runtime is kept busy, so the
    // instance counts as saturated.
    let app = spawn_app_with(|mut s| {
        s.shed_delay = Duration::from_micros(1);
        s.limit_delay = Duration::from_millis(200);
        s
    })
    .await;
    let _burner = burner();
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

#[tokio::test]
async fn an_idle_instance_sheds_nothing_however_long_other_processes_keep_its_probe_waiting() {
    // Every probe is over a target of a microsecond, as on a machine whose
    // cores other processes hold; the instance itself has nothing to do,
    // and refusing its requests would give back nothing. (Its answers are
    // what is checked: the metrics are the test process's, shared by the
    // instances of tests running beside this one.)
    let app = spawn_app_with(|mut s| {
        s.shed_delay = Duration::from_micros(1);
        s
    })
    .await;
    // A second and a half of reads (of probes, 150; ten over the target
    // refuse reads whole when the instance is busy).
    let started = Instant::now();
    let mut reads = 0;
    while started.elapsed() < Duration::from_millis(1_500) {
        let response = app.client.get(app.url("/vouchers")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "read {reads}");
        reads += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
