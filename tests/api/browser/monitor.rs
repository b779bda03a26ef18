//! The sale monitor in a real browser, watching a sale under load: the
//! numbers come alive (orders per second, the room's serving number,
//! refusals by code, purchase p99) and the stock drains to 0 on the
//! chart. A wrong admin token is told once, and forgotten.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::driver::Browser;
use crate::helpers::{answer, spawn_app, TestApp, ADMIN_TOKEN};

/// Joins the room as `token` and waits to be admitted: the ticket.
async fn admitted_ticket(app: &TestApp, voucher: i64, token: &str) -> Option<String> {
    let url = app.url(&format!("/vouchers/{voucher}/queue"));
    let (status, mut body) = answer(app.client.post(&url).bearer_auth(token)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    for _ in 0..600 {
        match body["status"].as_str() {
            Some("admitted") => return body["ticket"].as_str().map(str::to_owned),
            Some("sold_out") => return None,
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let ticket = body["ticket"].as_str().unwrap().to_owned();
        body = answer(
            app.client
                .get(&url)
                .bearer_auth(token)
                .header("x-queue-ticket", ticket),
        )
        .await
        .1;
    }
    panic!("not admitted within 30 s: {body}");
}

/// The load: buyers through the room, slowly until the test has seen
/// orders on the monitor (`orders_seen`), then as fast as they come until
/// the stock is gone; then purchases that are refused, until `done`.
async fn load(
    app: Arc<TestApp>,
    voucher: i64,
    orders_seen: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
) {
    let tokens = app.tokens(1..=400).await;
    let mut users = tokens.values();
    let purchase = app.url(&format!("/seckill/{voucher}"));
    while !done.load(Ordering::Relaxed) {
        let Some(token) = users.next() else { break };
        let Some(ticket) = admitted_ticket(&app, voucher, token).await else {
            break;
        };
        let (status, body) = answer(
            app.client
                .post(&purchase)
                .bearer_auth(token)
                .header("x-queue-ticket", ticket),
        )
        .await;
        if status == StatusCode::CONFLICT && body["error"] == "sold_out" {
            break;
        }
        if !orders_seen.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
    // Sold out: the crowd keeps pressing (without tickets the room no
    // longer hands out), and is refused.
    let token = tokens.values().next().unwrap();
    while !done.load(Ordering::Relaxed) {
        let _ = app.client.post(&purchase).bearer_auth(token).send().await;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
}

/// Enters `token` and `voucher` on the monitor's page and starts watching.
async fn watch(browser: &Browser, token: &str, voucher: i64) {
    browser.type_into("admin-token", token).await;
    browser
        .type_into("monitor-voucher", &voucher.to_string())
        .await;
    browser
        .run("document.getElementById('watch').click()")
        .await;
}

fn number(text: &Option<String>) -> Option<f64> {
    text.as_deref().and_then(|t| t.parse().ok())
}

#[tokio::test]
async fn the_monitor_shows_a_sale_drain_to_zero_with_live_numbers_needs_chromium() {
    let app = Arc::new(spawn_app().await);
    let voucher = app
        .open_voucher_with(
            30,
            json!({ "title": "Monitored", "waiting_room": { "admit_per_second": 1000 } }),
        )
        .await;
    let browser = Browser::start(1280).await;
    browser.goto(&app.url("/shop/monitor")).await;
    // The voucher first, the token last, and no click: watching starts
    // once typing pauses.
    browser
        .type_into("monitor-voucher", &voucher.to_string())
        .await;
    browser.type_into("admin-token", ADMIN_TOKEN).await;
    browser.wait_text("live-stock", "30").await;
    let stored = browser
        .run("return sessionStorage.getItem('seckill.admin')")
        .await;
    assert_eq!(stored, Value::String(ADMIN_TOKEN.into()));
    browser.assert_accessible("the monitor").await;

    let orders_seen = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let crowd = tokio::spawn(load(
        app.clone(),
        voucher,
        orders_seen.clone(),
        done.clone(),
    ));
    browser
        .wait_for(
            "orders per second above 0",
            || browser.text("live-orders-per-second"),
            |rate| number(rate) > Some(0.0),
        )
        .await;
    orders_seen.store(true, Ordering::Relaxed);
    browser.wait_text("live-stock", "0").await;
    browser
        .wait_for(
            "refusals by code",
            || browser.attribute("live-refusals", "data-codes"),
            |codes| codes.as_deref().is_some_and(|c| !c.is_empty()),
        )
        .await;
    let p99 = browser.text("live-p99-ms").await;
    assert!(number(&p99) > Some(0.0), "p99 {p99:?}");
    let serving = browser.text("live-serving").await;
    assert!(number(&serving) > Some(0.0), "serving {serving:?}");
    // Refusals a second: a number, and by code beside it.
    let refusals = browser.text("live-refusals").await;
    assert!(number(&refusals) > Some(0.0), "refusals {refusals:?}");
    let by_code = browser
        .run("return document.getElementById('live-refusal-codes').textContent")
        .await;
    assert!(
        by_code.as_str().is_some_and(|t| t.contains("/s")),
        "{by_code}"
    );
    // The chart drew the stock's readings, down to the last one, 0.
    let chart = browser
        .run(
            "const svg = document.querySelector('[data-testid=\"stock-chart\"]'); \
             const line = svg.querySelector('polyline'); \
             return { samples: Number(svg.dataset.samples), points: line ? line.getAttribute('points').split(' ').length : 0, \
                      last: svg.querySelector('text.end') ? svg.querySelector('text.end').textContent : null };",
        )
        .await;
    assert!(chart["samples"].as_i64() >= Some(2), "{chart}");
    assert_eq!(chart["points"], chart["samples"], "{chart}");
    assert_eq!(chart["last"], "0", "{chart}");
    browser.screenshot("monitor.png").await;
    done.store(true, Ordering::Relaxed);
    crowd.await.unwrap();
    let stats = app.stats(voucher).await;
    assert_eq!(
        (stats["stock"].as_i64(), stats["orders"].as_i64()),
        (Some(0), Some(30))
    );
    browser.close().await;
}

#[tokio::test]
async fn a_wrong_admin_token_is_told_forgotten_and_not_sent_again_needs_chromium() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(3).await;
    let browser = Browser::start(1280).await;
    browser.goto(&app.url("/shop/monitor")).await;
    // Counts the monitor's reads from here on.
    browser
        .run(
            "const fetched = window.fetch; window.reads = 0; \
             window.fetch = (...args) => { \
               if (String(args[0]).endsWith('/monitor')) window.reads += 1; \
               return fetched(...args); };",
        )
        .await;
    watch(&browser, "not-the-token", voucher).await;
    browser.wait_error("forbidden").await;
    assert_eq!(
        browser
            .run("return sessionStorage.getItem('seckill.admin')")
            .await,
        Value::Null,
        "a refused token is not kept"
    );
    // Before, the same refused read went out every second.
    let reads = browser.run("return window.reads").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(browser.run("return window.reads").await, reads);
    browser.close().await;
}

#[tokio::test]
async fn with_no_voucher_named_the_monitor_watches_the_newest_on_sale_and_every_figure_is_a_number_needs_chromium(
) {
    let app = spawn_app().await;
    // An older sale still running (it started earlier, and lists first)
    // and the one just opened.
    let older = app
        .create_voucher_from(json!({
            "title": "Older",
            "stock": 5,
            "begin_time": chrono::Utc::now() - chrono::Duration::minutes(30),
            "end_time": chrono::Utc::now() + chrono::Duration::hours(1),
        }))
        .await;
    let newest = app.open_voucher(7).await;
    assert!(newest > older);
    let browser = Browser::start(1280).await;
    browser.goto(&app.url("/shop/monitor")).await;
    browser
        .wait_for(
            "a voucher offered",
            || browser.run("return document.getElementById('monitor-voucher').value"),
            |value| value.as_str().is_some_and(|v| !v.is_empty()),
        )
        .await;
    browser.type_into("admin-token", ADMIN_TOKEN).await;
    browser.wait_text("live-stock", "7").await;
    // Nothing bought yet: the p99 is a number too, marked empty.
    for id in [
        "live-stock",
        "live-orders-per-second",
        "live-serving",
        "live-refusals",
        "live-p99-ms",
    ] {
        let text = browser.text(id).await;
        assert!(number(&text).is_some(), "{id} reads {text:?}");
    }
    assert_eq!(
        browser
            .attribute("live-p99-ms", "data-empty")
            .await
            .as_deref(),
        Some("true")
    );
    let watched = browser
        .run("return document.getElementById('monitor-voucher').value")
        .await;
    assert_eq!(watched, Value::String(newest.to_string()));
    browser.close().await;
}
