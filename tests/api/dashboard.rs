//! The Grafana dashboard's queries, run against a real Prometheus that
//! scrapes a running instance under a small load: every panel's query
//! returns data. Also `promtool check config` on the shipped config.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::task::JoinSet;

use crate::helpers::{buy, client, free_port, spawn_app};

const DASHBOARD: &str = include_str!("../../deploy/grafana/seckill.json");

struct Prometheus {
    port: u16,
    dir: std::path::PathBuf,
    child: Child,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_prometheus(target: &str) -> Prometheus {
    let dir = std::env::temp_dir().join(format!("seckill-prom-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: seckill\n    \
             static_configs:\n      - targets: [\"{target}\"]\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus is installed (scripts/deps.sh installs it)");
    Prometheus { port, dir, child }
}

/// Every query of the dashboard's panels.
fn queries() -> Vec<String> {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_shipped_prometheus_config_is_valid_needs_promtool() {
    let status = Command::new("promtool")
        .args([
            "check",
            "config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus.yml"),
        ])
        .stdout(Stdio::null())
        .status()
        .expect("promtool is installed (scripts/deps.sh installs it)");
    assert!(status.success(), "promtool check config failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_scraped_instance_needs_prometheus() {
    let app = spawn_app().await;
    let prometheus = start_prometheus(app.base.trim_start_matches("http://"));
    let api = format!("http://127.0.0.1:{}/api/v1", prometheus.port);
    let http = client();

    // A small sale for a few seconds while Prometheus scrapes every second:
    // orders, sold-out answers, batches, and lock contention (each user
    // sends two purchases at once); and an async sale beside it.
    let voucher = app.open_voucher(150).await;
    let async_voucher = app.open_async_voucher(1_000).await;
    // Orders that expire unpaid a second after they are made, for the
    // lifecycle's panels.
    let expiring = app
        .open_voucher_with(1_000, serde_json::json!({ "pay_within_seconds": 1 }))
        .await;
    let tokens = app.tokens(1..=300).await;
    let started = Instant::now();
    let mut users = tokens.values().cloned().cycle();
    while started.elapsed() < Duration::from_secs(6) {
        let mut tasks = JoinSet::new();
        for _ in 0..20 {
            let token = users.next().unwrap();
            for sold in [voucher, voucher, async_voucher, expiring] {
                let (http, base, token) = (http.clone(), app.base.clone(), token.clone());
                tasks.spawn(async move { buy(&http, &base, &token, sold).await });
            }
        }
        tasks.join_all().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    for query in queries() {
        let mut last = Value::Null;
        let mut found = false;
        for _ in 0..40 {
            let answer = http
                .get(format!("{api}/query"))
                .query(&[("query", query.as_str())])
                .send()
                .await;
            if let Ok(answer) = answer {
                last = answer.json().await.unwrap_or(Value::Null);
                if last["status"] == "success"
                    && last["data"]["result"]
                        .as_array()
                        .is_some_and(|r| !r.is_empty())
                {
                    found = true;
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(found, "no data for {query}: {last}");
    }
    app.check_invariants(voucher).await;
    app.check_invariants(async_voucher).await;
}

/// The metric names a query reads (`x_bucket`, `x_count`, `x_sum` read `x`).
fn metric_names(query: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut word = String::new();
    for c in query.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if (word.starts_with("seckill_") || word.starts_with("http_")) && c != '=' {
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|suffix| word.strip_suffix(suffix))
                .unwrap_or(&word);
            names.push(base.to_owned());
        }
        word.clear();
    }
    names
}

#[tokio::test]
async fn every_metric_the_dashboard_reads_is_on_a_fresh_instances_page() {
    let app = spawn_app().await;
    // The request counters exist once a request was served.
    let health = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert!(health.status().is_success());
    let page = app.metrics().await;
    let mut missing = Vec::new();
    for query in queries() {
        for name in metric_names(&query) {
            let shown = page.lines().any(|line| {
                line.starts_with(&format!("{name}{{"))
                    || line.starts_with(&format!("{name} "))
                    || line.starts_with(&format!("{name}_bucket{{"))
            });
            if !shown {
                missing.push(name);
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "not on a fresh instance's page: {missing:?}"
    );
}
