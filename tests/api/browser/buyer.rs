//! The buyer's whole path in a real browser: sign in (demo), watch the
//! countdown reach zero on the server's clock, join the waiting room, be
//! admitted, buy an async sale's last unit (`pending`, then `unpaid`), pay
//! and see `paid`; the next buyer is told `sold_out`. And a browser whose
//! clock is ten minutes ahead counts down to the same moment, and a room
//! that asks for proof of work is joined (the page solves it). The page's
//! clock keeps its best measure, and a non-JSON success is not the service.

use chrono::{DateTime, Duration, Utc};
use serde_json::{json, Value};

use super::driver::Browser;
use crate::helpers::TestApp;
use crate::storefront::spawn_demo;

/// The demo, and a desktop-wide browser on its shop's front page.
async fn demo_shop() -> (TestApp, Browser) {
    let app = spawn_demo().await;
    let browser = Browser::start(1280).await;
    browser.goto(&app.url("/shop/")).await;
    (app, browser)
}

/// Signs in as a fresh demo user on the page that is open (signed in as
/// another or not); answers the page's line naming the user.
async fn sign_in(browser: &Browser) -> String {
    let who = || async {
        browser
            .run("return document.getElementById('who').textContent")
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let before = who().await;
    browser.click("sign-in").await;
    browser
        .wait_for("signed in as a new demo user", who, |now| {
            now.starts_with("Signed in as user") && *now != before
        })
        .await
}

/// A voucher on sale for an hour from `begin`, with `fields` (its title,
/// stock and the rest) in its `POST /admin/vouchers` body.
async fn on_sale_for_an_hour(app: &TestApp, begin: DateTime<Utc>, fields: Value) -> i64 {
    let mut body = fields;
    body["begin_time"] = json!(begin);
    body["end_time"] = json!(begin + Duration::hours(1));
    app.create_voucher_from(body).await
}

/// Goes to the shop's page of `voucher`.
async fn on_voucher_page(browser: &Browser, app: &TestApp, voucher: i64) {
    browser
        .goto(&app.url(&format!("/shop/#/vouchers/{voucher}")))
        .await;
}

/// Waits for the voucher's page, showing `stock` units left.
async fn voucher_page_shows(browser: &Browser, stock: &str) {
    browser
        .wait_for(
            "the voucher card's page",
            || browser.text("stock"),
            |shown| shown.as_deref() == Some(stock),
        )
        .await;
}

/// The countdown's seconds left, as the page shows them.
async fn seconds_left(browser: &Browser) -> Option<i64> {
    browser
        .attribute("countdown", "data-seconds")
        .await
        .and_then(|s| s.parse().ok())
}

/// After a join: a place in the room, then admitted (the buy button
/// opens), then the purchase, stored `unpaid`.
async fn placed_admitted_and_bought(browser: &Browser) {
    browser
        .wait_for(
            "a place in the room",
            || browser.text("queue-place"),
            |place| place.as_deref().is_some_and(|p| p.parse::<i64>().is_ok()),
        )
        .await;
    browser.wait_enabled("buy").await;
    browser.click("buy").await;
    browser.wait_text("order-status", "unpaid").await;
}

#[tokio::test]
async fn a_buyer_counts_down_queues_buys_and_pays_and_the_next_finds_it_sold_out_needs_chromium() {
    let (app, browser) = demo_shop().await;
    sign_in(&browser).await;

    // The sale starts a few seconds from now: one unit, async, behind a
    // waiting room.
    let begin = Utc::now() + Duration::seconds(4);
    let voucher = on_sale_for_an_hour(
        &app,
        begin,
        json!({
            "title": "Last unit",
            "stock": 1,
            "sale_mode": "async",
            "price_cents": 250,
            "waiting_room": { "admit_per_second": 100 },
        }),
    )
    .await;
    on_voucher_page(&browser, &app, voucher).await;
    voucher_page_shows(&browser, "1").await;
    browser.assert_accessible("the voucher's page").await;
    let before = browser
        .wait_for(
            "a countdown before the start",
            || seconds_left(&browser),
            |left| left.is_some(),
        )
        .await
        .unwrap();
    // Whatever this machine's pace, the countdown said some time left
    // before the start, with the buy button shut: unless the start passed
    // already while the page loaded.
    let server_left = (begin - Utc::now()).num_milliseconds();
    if before > 0 && server_left > 500 {
        assert!(
            !browser.enabled("buy").await,
            "buy is open before the start"
        );
        assert!(
            before <= 5,
            "the countdown counts to the server's start: {before}"
        );
    }
    browser.screenshot("shop-countdown.png").await;

    // Into the room before the start: placed at the start, then admitted.
    browser.click("join-queue").await;
    browser.wait_text("countdown", "0:00:00").await;
    placed_admitted_and_bought(&browser).await;
    browser
        .assert_accessible("the voucher's page with an unpaid order")
        .await;
    browser.screenshot("shop-unpaid.png").await;
    browser.click("pay").await;
    browser.wait_text("order-status", "paid").await;
    assert_eq!(
        browser.attribute("message", "data-error").await.as_deref(),
        Some("")
    );

    // The next buyer in this tab signs in over the first (no sign-out): a
    // fresh demo user, who sees no order and is not in the room; the room
    // or the purchase says sold out.
    sign_in(&browser).await;
    browser
        .wait_for(
            "the last buyer's order no longer shown",
            || browser.text("order-status"),
            |status| status.is_none(),
        )
        .await;
    browser.click("join-queue").await;
    let outcome = browser
        .wait_for(
            "sold out, or admitted",
            || async {
                let error = browser.attribute("message", "data-error").await;
                (error, browser.enabled("buy").await)
            },
            |(error, open)| error.as_deref() == Some("sold_out") || *open,
        )
        .await;
    if outcome.0.as_deref() != Some("sold_out") {
        browser.click("buy").await;
    }
    browser.wait_error("sold_out").await;
    let message = browser.text("message").await.unwrap_or_default();
    assert!(message.starts_with("Sold out"), "{message}");
    browser.screenshot("shop-sold-out.png").await;
    browser.close().await;
}

#[tokio::test]
async fn a_browser_whose_clock_is_ten_minutes_ahead_counts_down_to_the_same_start_needs_chromium() {
    let app = spawn_demo().await;
    let begin = Utc::now() + Duration::minutes(20);
    let voucher = on_sale_for_an_hour(&app, begin, json!({ "title": "Later", "stock": 5 })).await;
    let browser = Browser::start(390).await;
    browser.goto(&app.url("/shop/")).await;
    browser
        .wait_for(
            "the voucher's card in the list",
            || browser.text("voucher-card"),
            |card| card.is_some(),
        )
        .await;
    browser
        .assert_accessible("the list of vouchers at a phone's width")
        .await;
    // The browser's clock, ten minutes ahead from here on; then the
    // voucher's page, reached without a reload (the page measures the
    // server's clock as it loads it).
    browser
        .run(
            "const real = Date.now.bind(Date); \
             Date.now = () => real() + 600000; \
             location.hash = '#/vouchers/__ID__';"
                .replace("__ID__", &voucher.to_string())
                .as_str(),
        )
        .await;
    let left = browser
        .wait_for(
            "the countdown",
            || seconds_left(&browser),
            |left| left.is_some_and(|s| s > 0),
        )
        .await
        .unwrap();
    let truth = (begin - Utc::now()).num_seconds();
    // The browser's own clock would say ten minutes less.
    assert!(
        (truth - 30..=truth + 2).contains(&left),
        "the countdown says {left} s, the server's clock {truth} s"
    );
    let shown = browser.text("countdown").await.unwrap();
    assert!(
        shown.starts_with("0:19:") || shown.starts_with("0:20:"),
        "{shown}"
    );
    assert!(!browser.enabled("buy").await);
    browser.close().await;
}

#[tokio::test]
async fn the_page_keeps_the_clock_of_the_shortest_round_trip_and_takes_a_stepped_clock_needs_chromium(
) {
    let (_app, browser) = demo_shop().await;
    // Samples as (server's time, sent, received) in ms; the offset kept
    // after each. A slower answer that agrees with the kept offset leaves
    // it (the latest sample alone would say 3800); a shorter round trip
    // replaces it; a clock set ten minutes ahead is followed at once.
    let offsets = browser
        .run(
            "const c = Seckill.clock; const at = ms => new Date(ms).toISOString(); \
             const seen = []; \
             c.sync(at(5000), 1000, 1010); seen.push(c.offset); \
             c.sync(at(6000), 2000, 2400); seen.push(c.offset); \
             c.sync(at(7004), 3000, 3004); seen.push(c.offset); \
             c.sync(at(8000), 604000, 604010); seen.push(c.offset); \
             return seen;",
        )
        .await;
    assert_eq!(offsets, json!([3995, 3995, 4002, -596005]));
    // A success that is not the service's JSON (a captive portal's page)
    // is told as the service not reached, not thrown in the page.
    let answer = browser
        .run_async(
            "const done = arguments[arguments.length - 1]; \
             Seckill.call('GET', '/shop/').then(a => done([a.status, a.body.error]));",
        )
        .await;
    assert_eq!(answer, json!([0, "network"]));
    browser.close().await;
}

#[tokio::test]
async fn a_buyer_joins_a_room_that_asks_for_proof_of_work_and_buys_needs_chromium() {
    // The page solves the room's proof of work (the challenge in the 400's
    // body) and joins with it: before, every click was "malformed".
    let app = spawn_demo().await;
    let browser = Browser::start(1280).await;
    let begin = Utc::now() - Duration::seconds(1);
    let voucher = on_sale_for_an_hour(
        &app,
        begin,
        json!({
            "title": "Proof",
            "stock": 2,
            "waiting_room": { "admit_per_second": 100, "proof_of_work_bits": 12 },
        }),
    )
    .await;
    on_voucher_page(&browser, &app, voucher).await;
    sign_in(&browser).await;
    voucher_page_shows(&browser, "2").await;
    browser.click("join-queue").await;
    placed_admitted_and_bought(&browser).await;
    browser.close().await;
}

#[tokio::test]
async fn the_page_follows_an_order_changed_elsewhere_and_shows_only_the_voucher_it_is_on_needs_chromium(
) {
    let (app, browser) = demo_shop().await;
    sign_in(&browser).await;
    let one_unit = app
        .create_voucher_from(json!({
            "title": "One unit an order",
            "stock": 5,
            "begin_time": Utc::now() - Duration::seconds(5),
            "end_time": Utc::now() + Duration::hours(1),
        }))
        .await;
    let units = app
        .create_voucher_from(json!({
            "title": "Up to three",
            "stock": 5,
            "max_units_per_user": 3,
            "begin_time": Utc::now() - Duration::seconds(5),
            "end_time": Utc::now() + Duration::hours(1),
        }))
        .await;
    let named_quantities = "return document.querySelectorAll('[data-testid=\"quantity\"]').length";

    // A voucher of more than one unit an order names its quantity box.
    on_voucher_page(&browser, &app, units).await;
    browser.wait_text("stock", "5").await;
    assert_eq!(browser.run(named_quantities).await, json!(1));
    browser
        .run("const q = document.getElementById('quantity'); q.value = '3';")
        .await;

    // One unit an order: no quantity box named; the 3 typed for the last
    // voucher does not stop the form.
    on_voucher_page(&browser, &app, one_unit).await;
    browser.wait_text("stock", "5").await;
    assert_eq!(browser.run(named_quantities).await, json!(0));
    browser.wait_enabled("buy").await;
    browser.click("buy").await;
    browser.wait_text("order-status", "unpaid").await;

    // Cancelled by the admin, not on this page: the page shows it.
    let order = browser
        .run("return document.getElementById('order-id').textContent")
        .await;
    let order = order.as_str().unwrap();
    let (status, _) = app
        .post_as(
            &format!("/orders/{order}/cancel"),
            crate::helpers::ADMIN_TOKEN,
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::OK);
    browser.wait_text("order-status", "cancelled").await;

    // A voucher that does not exist: told, and nothing of the last one
    // left to buy.
    browser.goto(&app.url("/shop/#/vouchers/999999")).await;
    browser.wait_error("not_found").await;
    assert_eq!(browser.text("stock").await.as_deref(), Some(""));
    assert!(!browser.enabled("buy").await, "buy is open on no voucher");
    browser.close().await;
}

#[tokio::test]
async fn a_failed_refresh_is_told_and_taken_away_once_the_service_answers_again_needs_chromium() {
    let (app, browser) = demo_shop().await;
    let voucher = on_sale_for_an_hour(
        &app,
        Utc::now() - Duration::seconds(5),
        json!({ "title": "Refreshed", "stock": 1 }),
    )
    .await;
    on_voucher_page(&browser, &app, voucher).await;
    voucher_page_shows(&browser, "1").await;
    // The service out of reach for the page's own reads: the refresh says
    // so; once it answers again, the next refresh takes the error away.
    browser
        .run(
            "window.realFetch = window.fetch; \
             window.fetch = () => Promise.reject(new TypeError('offline'));",
        )
        .await;
    browser.wait_error("network").await;
    browser.run("window.fetch = window.realFetch;").await;
    browser.wait_error("").await;
    assert_eq!(browser.text("message").await.as_deref(), Some(""));
    // What the buyer's own action was told stays through the refreshes:
    // the one unit bought, the next buyer is told "sold out", and still is
    // after two refreshes that succeeded.
    sign_in(&browser).await;
    browser.wait_enabled("buy").await;
    browser.click("buy").await;
    browser.wait_text("order-status", "unpaid").await;
    sign_in(&browser).await;
    browser.wait_enabled("buy").await;
    browser.click("buy").await;
    browser.wait_error("sold_out").await;
    tokio::time::sleep(std::time::Duration::from_millis(4_500)).await;
    assert_eq!(
        browser.attribute("message", "data-error").await.as_deref(),
        Some("sold_out")
    );
    browser.close().await;
}
