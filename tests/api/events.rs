//! Order events: one per committed change, in the feed in commit order, and
//! pushed to a webhook receiver (signed, retried, failed and retried again
//! by hand, in order within each order).

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use testkit::{Answering as Mode, Receiver};

use crate::helpers::{
    assert_refused_to_start, buy, notify, poll_until, spawn_app, spawn_app_with, TestApp,
    ADMIN_TOKEN,
};

const WEBHOOK_SECRET: &str = "test-webhook-secret-3b9d7f1a5c2e8d4b6f0a";

impl TestApp {
    /// Every event of the feed, read a page of `page` at a time; fails the
    /// test on a page that is not `200` or whose `next` is not its last id.
    async fn all_events(&self, page: usize) -> Vec<Value> {
        let mut events = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let path = match &after {
                Some(id) => format!("/admin/events?limit={page}&after={id}"),
                None => format!("/admin/events?limit={page}"),
            };
            let (status, body) = self.admin_get(&path).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let got = body["events"].as_array().unwrap().clone();
            let next = body["next"].as_str().unwrap().to_owned();
            if let Some(last) = got.last() {
                assert_eq!(last["id"].as_str(), Some(next.as_str()));
            }
            if got.is_empty() {
                return events;
            }
            events.extend(got);
            after = Some(next);
        }
    }

    /// The events of one order once the feed shows at least `count` of
    /// them (an event shows once every older transaction of the cluster
    /// has ended: on a busy one, a moment after its own commit).
    async fn events_of_at_least(&self, order_id: &str, count: usize) -> Vec<(String, i64, String)> {
        poll_until(
            Duration::from_secs(30),
            Duration::from_millis(100),
            "the order's events in the feed",
            || self.events_of(order_id),
            |events| events.len() >= count,
        )
        .await
    }

    /// The events of one order, in the feed's order, as (type, sequence,
    /// status).
    async fn events_of(&self, order_id: &str) -> Vec<(String, i64, String)> {
        self.all_events(100)
            .await
            .into_iter()
            .filter(|e| e["order"]["order_id"] == order_id)
            .map(|e| {
                (
                    e["type"].as_str().unwrap().to_owned(),
                    e["sequence"].as_i64().unwrap(),
                    e["order"]["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }
}

fn kinds(list: &[(&str, i64, &str)]) -> Vec<(String, i64, String)> {
    list.iter()
        .map(|(t, s, st)| ((*t).to_owned(), *s, (*st).to_owned()))
        .collect()
}

/// Buys as `user` in the voucher's mode; the order id once it is stored
/// (at once in sync, when the writer has stored it in async).
async fn stored_order(app: &TestApp, mode: &str, user: i64, voucher: i64) -> String {
    if mode == "sync" {
        return app.buy_one(&app.base, user, voucher).await;
    }
    let token = app.token(user).await;
    let (status, body) = app.buy_async(&token, voucher).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let order = body["order_id"].as_str().unwrap().to_owned();
    app.wait_status(&order, "unpaid", Duration::from_secs(15))
        .await;
    order
}

/// Every kind of event in one sale of `mode`: created, paid, a second
/// payment's refund due, cancelled and expired, each order's events in
/// sequence with the order as it stood at that change.
async fn every_change_is_one_event(mode: &str) {
    let app = spawn_app().await;
    let voucher = app.priced_voucher(10, mode, 500, 900).await;
    // Paid, then paid again under another payment id: refund due.
    let paid = stored_order(&app, mode, 1, voucher).await;
    let (status, _) = notify(&app.client, &app.base, "pay-1", &paid, 500).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = notify(&app.client, &app.base, "pay-2", &paid, 500).await;
    assert_eq!(
        (status, body["refund"].as_bool()),
        (StatusCode::OK, Some(true))
    );
    // The same notification again changes nothing: no second event.
    notify(&app.client, &app.base, "pay-2", &paid, 500).await;
    // Cancelled.
    let cancelled = stored_order(&app, mode, 2, voucher).await;
    let token = app.token(2).await;
    let (status, body) = app.cancel(&app.base, &cancelled, &token).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Expired: unpaid past a one-second deadline.
    let expiring = app.priced_voucher(5, mode, 0, 1).await;
    let expired = stored_order(&app, mode, 3, expiring).await;
    app.wait_status(&expired, "expired", Duration::from_secs(15))
        .await;

    assert_eq!(
        app.events_of_at_least(&paid, 3).await,
        kinds(&[
            ("order.created", 1, "unpaid"),
            ("order.paid", 2, "paid"),
            ("payment.refund_due", 3, "paid"),
        ])
    );
    assert_eq!(
        app.events_of_at_least(&cancelled, 2).await,
        kinds(&[
            ("order.created", 1, "unpaid"),
            ("order.cancelled", 2, "cancelled")
        ])
    );
    assert_eq!(
        app.events_of_at_least(&expired, 2).await,
        kinds(&[
            ("order.created", 1, "unpaid"),
            ("order.expired", 2, "expired")
        ])
    );
    let events = app.all_events(100).await;
    let refund = events
        .iter()
        .find(|e| e["type"] == "payment.refund_due")
        .unwrap();
    assert_eq!(
        refund["payment"],
        json!({ "payment_id": "pay-2", "amount_cents": 500 })
    );
    assert!(events
        .iter()
        .filter(|e| e["type"] != "payment.refund_due")
        .all(|e| e.get("payment").is_none()));
    // The order as GET /orders/{id} shows it, at that change.
    let (_, order) = app.admin_get(&format!("/orders/{paid}")).await;
    let paid_event = events.iter().find(|e| e["type"] == "order.paid").unwrap();
    assert_eq!(paid_event["order"], order);
    let ids: Vec<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(ids, sorted, "ids unique and increasing in the feed");
}

#[tokio::test]
async fn every_change_of_a_sync_order_is_one_event_with_the_order_as_it_stood() {
    every_change_is_one_event("sync").await;
}

#[tokio::test]
async fn every_change_of_an_async_order_is_one_event_once_the_order_is_stored() {
    every_change_is_one_event("async").await;
}

#[tokio::test]
async fn the_feed_reads_on_from_any_id_with_no_event_missed_or_repeated() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(30).await;
    let tokens = app.tokens(1..=30).await;
    crate::helpers::crowd(&[&app.base], &tokens, voucher, 1).await;
    // An event shows once every transaction older than its own has ended,
    // in any database of the cluster: on a busy one, a moment later.
    let whole = poll_until(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "the 30 orders' events in the feed",
        || app.all_events(1000),
        |events| events.len() >= 30,
    )
    .await;
    assert_eq!(whole.len(), 30);
    for page in [1, 7] {
        assert_eq!(app.all_events(page).await, whole, "pages of {page}");
    }
    // Past the end: nothing, and `next` is the `after` given.
    let last = whole.last().unwrap()["id"].as_str().unwrap();
    let (status, body) = app.admin_get(&format!("/admin/events?after={last}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({ "events": [], "next": last }));
    // Bad cursors and limits; users and strangers.
    for bad in ["after=12", "after=zz", "limit=0", "limit=1001", "limit=x"] {
        let (status, body) = app.admin_get(&format!("/admin/events?{bad}")).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("bad_request")),
            "{bad}"
        );
    }
    let (status, _) = app.get_as("/admin/events", &tokens[&1]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// A receiver of this file's webhook secret, answering as `mode`; its URL.
async fn start_receiver(mode: Mode) -> (Receiver, String) {
    Receiver::start(WEBHOOK_SECRET.as_bytes(), mode)
        .await
        .expect("the receiver listens")
}

/// What the tests wait for and assert of a receiver's deliveries.
trait Received {
    async fn acknowledged_at_least(&self, n: usize) -> Vec<Value>;
    async fn acknowledged_in_order(&self, n: usize) -> Vec<Value>;
    async fn any_acknowledged(&self, what: &str) -> Vec<Value>;
    fn assert_each_sent_after_its_orders_earlier_ones_were_acknowledged(&self);
    async fn attempted(&self, n: usize);
}

impl Received for Receiver {
    /// Waits (30 s at most) until `n` events were acknowledged; all of
    /// them, in the order received.
    async fn acknowledged_at_least(&self, n: usize) -> Vec<Value> {
        poll_until(
            Duration::from_secs(30),
            Duration::from_millis(200),
            &format!("{n} events acknowledged"),
            || async { self.acknowledged() },
            |a| a.len() >= n,
        )
        .await
    }

    /// Waits for `n` acknowledged events (as [`Received::acknowledged_at_least`]),
    /// each in its order's sequence and sent only after its order's
    /// earlier events were acknowledged.
    async fn acknowledged_in_order(&self, n: usize) -> Vec<Value> {
        let acknowledged = self.acknowledged_at_least(n).await;
        assert_in_order_per_order(&acknowledged);
        self.assert_each_sent_after_its_orders_earlier_ones_were_acknowledged();
        acknowledged
    }

    /// Waits (10 s at most) until some event was acknowledged (`what`);
    /// those acknowledged then.
    async fn any_acknowledged(&self, what: &str) -> Vec<Value> {
        poll_until(
            Duration::from_secs(10),
            Duration::from_millis(100),
            what,
            || async { self.acknowledged() },
            |a| !a.is_empty(),
        )
        .await
    }

    /// The contract's order, delivery by delivery: an event came (whatever
    /// the answer) only after every earlier event of its order had been
    /// acknowledged by an earlier delivery, not in the same one.
    fn assert_each_sent_after_its_orders_earlier_ones_were_acknowledged(&self) {
        self.deliveries(|deliveries| {
            let mut acknowledged: std::collections::HashMap<String, i64> = Default::default();
            for (i, delivery) in deliveries.iter().enumerate() {
                let of = |e: &Value| {
                    let order = e["order"]["order_id"].as_str().unwrap().to_owned();
                    (order, e["sequence"].as_i64().unwrap())
                };
                for (order, sequence) in delivery.events.iter().map(of) {
                    let before = acknowledged.get(&order).copied().unwrap_or(0);
                    assert!(
                        sequence <= before + 1,
                        "delivery {i}: order {order}'s event {sequence} before its event {} was acknowledged",
                        before + 1
                    );
                }
                if delivery.acknowledged {
                    for (order, sequence) in delivery.events.iter().map(of) {
                        let highest = acknowledged.entry(order).or_default();
                        *highest = (*highest).max(sequence);
                    }
                }
            }
        });
    }

    /// Waits (10 s at most) until `n` deliveries have been attempted.
    async fn attempted(&self, n: usize) {
        poll_until(
            Duration::from_secs(10),
            Duration::from_millis(100),
            &format!("{n} attempts"),
            || async { self.attempts() },
            |got| *got >= n,
        )
        .await;
    }
}

/// A receiver in `mode`, an app whose webhooks go to it (failed after
/// `retry_seconds`), and a priced voucher of `orders` units, each bought
/// by a user of its own.
async fn sold_with_webhook(
    mode: Mode,
    retry_seconds: u64,
    orders: i64,
) -> (Receiver, TestApp, i64) {
    let (receiver, url) = start_receiver(mode).await;
    let app = app_with_webhook(&url, retry_seconds).await;
    let voucher = app.priced_voucher(orders, "sync", 0, 900).await;
    let tokens = app.tokens(1..=orders).await;
    crate::helpers::crowd(&[&app.base], &tokens, voucher, 1).await;
    (receiver, app, voucher)
}

/// A failing receiver, an app whose webhooks go to it (failed after
/// `retry_seconds`), a priced voucher of two units, two buyers' tokens,
/// and the first buyer's order.
async fn first_of_two_orders(
    retry_seconds: u64,
) -> (
    Receiver,
    TestApp,
    i64,
    std::collections::HashMap<i64, String>,
) {
    let (receiver, url) = start_receiver(Mode::Fail).await;
    let app = app_with_webhook(&url, retry_seconds).await;
    let voucher = app.priced_voucher(2, "sync", 0, 900).await;
    let tokens = app.tokens(1..=2).await;
    app.assert_bought(&tokens[&1], voucher).await;
    (receiver, app, voucher, tokens)
}

/// `GET /admin/webhooks/failed` once it lists `n` events (30 s at most).
async fn failed_at_least(app: &TestApp, n: usize) -> Value {
    poll_until(
        Duration::from_secs(30),
        Duration::from_millis(200),
        &format!("{n} events failed"),
        || async { app.admin_get("/admin/webhooks/failed").await.1 },
        |body| body["events"].as_array().is_some_and(|e| e.len() >= n),
    )
    .await
}

/// Pays every order of `voucher` through the provider's notification.
async fn pay_every_order(app: &TestApp, voucher: i64) {
    let (_, orders) = app
        .admin_get(&format!("/admin/vouchers/{voucher}/orders"))
        .await;
    for (i, order) in orders["orders"].as_array().unwrap().iter().enumerate() {
        let id = order["order_id"].as_str().unwrap();
        let (status, _) = notify(&app.client, &app.base, &format!("p{i}"), id, 0).await;
        assert_eq!(status, StatusCode::OK);
    }
}

/// `POST /admin/webhooks/retry`: every failed event put back.
async fn put_back(app: &TestApp) -> (StatusCode, Value) {
    app.post_as("/admin/webhooks/retry", ADMIN_TOKEN).await
}

async fn app_with_webhook(url: &str, retry_seconds: u64) -> TestApp {
    let url = url.to_owned();
    spawn_app_with(move |mut s| {
        s.webhook_url = Some(url);
        s.webhook_secret = Some(WEBHOOK_SECRET.to_owned().into());
        s.webhook_timeout = Duration::from_millis(500);
        s.webhook_batch = 7;
        s.webhook_retry_seconds = retry_seconds;
        s
    })
    .await
}

/// Every acknowledged event of each order came after the earlier ones of
/// that order were acknowledged: within an order, sequences 1, 2, ... in
/// the order received, each once among the acknowledged.
fn assert_in_order_per_order(acknowledged: &[Value]) {
    let mut next: std::collections::HashMap<String, i64> = Default::default();
    for event in acknowledged {
        let order = event["order"]["order_id"].as_str().unwrap().to_owned();
        let seen = next.entry(order.clone()).or_insert(1);
        assert_eq!(
            event["sequence"].as_i64(),
            Some(*seen),
            "order {order} out of order"
        );
        *seen += 1;
    }
}

#[tokio::test]
async fn webhooks_deliver_every_event_signed_and_retry_a_failing_receiver_in_order() {
    let (receiver, app, voucher) = sold_with_webhook(Mode::Fail, 86_400, 20).await;
    // Failing: attempts come (the first retry within 2 s), nothing acked.
    receiver.attempted(2).await;
    assert!(receiver.acknowledged().is_empty());
    // Pay every order while the receiver is down: a later event of each.
    pay_every_order(&app, voucher).await;
    receiver.set(Mode::Acknowledge);
    let acknowledged = receiver.acknowledged_in_order(40).await;
    let mut ids: Vec<&str> = acknowledged
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 40, "each event acknowledged once");
    assert!(receiver.deliveries(|d| d.iter().all(|d| (1..=7).contains(&d.events.len()))));
    assert_eq!(receiver.bad_signatures(), 0);
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("seckill_webhook_deliveries_total{outcome=\"acknowledged\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("seckill_webhook_deliveries_total{outcome=\"refused\"}"));
}

#[tokio::test]
async fn a_hanging_or_redirecting_receiver_is_a_failure_and_failed_events_are_listed_and_retried() {
    let (receiver, url) = start_receiver(Mode::Hang).await;
    // Failed once a batch's first attempt is a second old.
    let app = app_with_webhook(&url, 1).await;
    let voucher = app.open_voucher(3).await;
    let tokens = app.tokens(1..=3).await;
    crate::helpers::crowd(&[&app.base], &tokens, voucher, 1).await;
    // The hang meets the 500 ms timeout; then redirects are not followed.
    receiver.attempted(1).await;
    receiver.set(Mode::Redirect);
    let failed = failed_at_least(&app, 3).await;
    assert!(failed["events"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["type"] == "order.created"));
    assert!(receiver.acknowledged().is_empty());
    let attempts = receiver.attempts();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        receiver.attempts(),
        attempts,
        "failed events are not sent again by themselves"
    );

    receiver.set(Mode::Acknowledge);
    let (status, body) = put_back(&app).await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "retried": 3 })));
    poll_until(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "the retried events acknowledged",
        || async { receiver.acknowledged().len() },
        |n| *n == 3,
    )
    .await;
    let (_, failed) = app.admin_get("/admin/webhooks/failed").await;
    assert_eq!(failed, json!({ "events": [] }));
}

#[tokio::test]
async fn failed_events_put_back_in_more_than_one_batch_still_go_out_in_order_per_order() {
    // Failed once a batch's first attempt is a second old; seven a batch.
    let (receiver, app, voucher) = sold_with_webhook(Mode::Fail, 1, 4).await;
    pay_every_order(&app, voucher).await;
    // Four orders created, then paid: eight events, all failed.
    failed_at_least(&app, 8).await;
    // Put back: the first batch of seven fails again and is failed; the
    // eighth, the last order's payment, would go alone, before the
    // creation of its order, failed in the first batch.
    receiver.set(Mode::AcknowledgeOne);
    assert_eq!(put_back(&app).await.0, StatusCode::OK);
    let attempts = receiver.attempts();
    receiver.attempted(attempts + 2).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let taken = receiver.acknowledged();
    assert_in_order_per_order(&taken);
    receiver.assert_each_sent_after_its_orders_earlier_ones_were_acknowledged();
    // Every event not taken is listed as failed, the one waiting behind
    // its order's creation too, and put back by the next retry.
    let (_, failed) = app.admin_get("/admin/webhooks/failed").await;
    let failed = failed["events"].as_array().unwrap().len();
    assert_eq!(
        failed + taken.len(),
        8,
        "{failed} failed, {} taken",
        taken.len()
    );
    // Once the receiver takes them, every event goes out, in order.
    receiver.set(Mode::Acknowledge);
    let (status, retried) = put_back(&app).await;
    assert_eq!(
        (status, retried["retried"].as_u64()),
        (StatusCode::OK, Some(failed as u64))
    );
    receiver.acknowledged_in_order(8).await;
}

#[tokio::test]
async fn an_order_created_and_paid_while_the_receiver_fails_is_sent_one_event_a_delivery() {
    let (receiver, app, voucher, tokens) = first_of_two_orders(86_400).await;
    // The first order's batch fails; the second order is made, and both
    // are paid, meanwhile: its creation and payment come in one read of
    // the feed once the first batch is acknowledged.
    receiver.attempted(1).await;
    app.assert_bought(&tokens[&2], voucher).await;
    pay_every_order(&app, voucher).await;
    receiver.set(Mode::Acknowledge);
    // Before: the second order's order.created and order.paid went in one
    // delivery, the payment before the creation was acknowledged.
    receiver.acknowledged_in_order(4).await;
}

#[tokio::test]
async fn events_put_back_retry_on_a_clock_of_their_own() {
    // A batch is failed once its first attempt is 2 s old.
    let (receiver, app, voucher, tokens) = first_of_two_orders(2).await;
    let failed = failed_at_least(&app, 1).await;
    let first = failed["events"][0]["order"]["order_id"].clone();
    // The second order's batch fails now, as though for hours: its next
    // attempt ten minutes away.
    app.assert_bought(&tokens[&2], voucher).await;
    // (Once its first failure is recorded, not before: the record would
    // overwrite this.)
    poll_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        "the second order's batch failed",
        || async {
            sqlx::query(
                "UPDATE webhook_cursor
                 SET failures = 12, next_attempt_at = now() + interval '10 minutes'
                 WHERE failing_upto_tx IS NOT NULL AND failures > 0",
            )
            .execute(&app.db)
            .await
            .unwrap()
            .rows_affected()
        },
        |updated| *updated == 1,
    )
    .await;
    receiver.set(Mode::Acknowledge);
    // Put back, the first order's event goes at once (it waited out the
    // feed's ten minutes before) ...
    assert_eq!(put_back(&app).await.0, StatusCode::OK);
    let acknowledged = receiver
        .any_acknowledged("the event put back acknowledged")
        .await;
    assert_eq!(acknowledged.len(), 1, "{acknowledged:?}");
    assert_eq!(acknowledged[0]["order"]["order_id"], first);
    // ... and its acknowledgement leaves the feed's failing batch as it
    // was (it cleared the feed's failures, which sent it at once).
    let (failures, backing_off): (i32, bool) = sqlx::query_as(
        "SELECT failures, next_attempt_at > now() + interval '1 minute' FROM webhook_cursor",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert!(
        failures >= 12 && backing_off,
        "{failures} failures, {backing_off}"
    );
    assert_eq!(receiver.acknowledged().len(), 1);
}

#[tokio::test]
async fn an_event_that_comes_while_a_batch_fails_is_not_failed_with_it() {
    // A batch is failed once its first attempt is 3 s old.
    let (receiver, app, voucher, tokens) = first_of_two_orders(3).await;
    receiver.attempted(1).await;
    // The second order's event commits while the first one's batch fails.
    app.assert_bought(&tokens[&2], voucher).await;
    let failed = poll_until(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "the first batch failed",
        || async { app.admin_get("/admin/webhooks/failed").await.1 },
        |body| body["events"].as_array().is_some_and(|e| !e.is_empty()),
    )
    .await;
    receiver.set(Mode::Acknowledge);
    let failed = failed["events"].as_array().unwrap().clone();
    assert_eq!(
        failed.len(),
        1,
        "only the failing batch's event is failed: {failed:?}"
    );
    let first = failed[0]["order"]["order_id"].as_str().unwrap().to_owned();
    assert!(
        receiver.deliveries(|d| d.iter().all(|d| d.events.len() == 1)),
        "the failing batch was retried as it was, nothing added"
    );
    // The second event, in a batch of its own with a period of its own, is
    // delivered once the receiver answers.
    let acknowledged = receiver
        .any_acknowledged("the second order's event acknowledged")
        .await;
    assert_eq!(acknowledged.len(), 1, "{acknowledged:?}");
    assert_ne!(
        acknowledged[0]["order"]["order_id"].as_str(),
        Some(first.as_str())
    );
}

/// The instance that holds the webhooks' lease in `db`, if any.
async fn lease_holder(db: &sqlx::PgPool) -> Option<uuid::Uuid> {
    sqlx::query_scalar("SELECT holder FROM webhook_cursor")
        .fetch_one(db)
        .await
        .unwrap()
}

/// An instance of a database of its own whose webhooks go to a receiver,
/// stopped by the test.
struct WebhookInstance {
    running: crate::helpers::Stoppable,
    receiver: Receiver,
    db: sqlx::PgPool,
    db_name: String,
    prefix: String,
}

impl WebhookInstance {
    async fn start(mode: Mode, tune: impl FnOnce(&mut seckill::config::Settings)) -> Self {
        let (receiver, url) = start_receiver(mode).await;
        let db_name = format!("seckill_test_{}", uuid::Uuid::new_v4().simple());
        let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
        let db_url = format!("{}/{db_name}", crate::helpers::pg_server());
        let mut settings = crate::helpers::settings(&db_url, &crate::helpers::redis_url(), &prefix);
        settings.webhook_url = Some(url);
        settings.webhook_secret = Some(WEBHOOK_SECRET.to_owned().into());
        tune(&mut settings);
        let running = crate::helpers::start_stoppable(settings).await;
        let db = sqlx::PgPool::connect(&db_url).await.unwrap();
        Self {
            running,
            receiver,
            db,
            db_name,
            prefix,
        }
    }

    /// The instance that holds the webhooks' lease, if any.
    async fn holder(&self) -> Option<uuid::Uuid> {
        lease_holder(&self.db).await
    }

    /// Stops the instance; who holds the lease then.
    async fn stop(self) -> Option<uuid::Uuid> {
        let crate::helpers::Stoppable { stop, stopped, .. } = self.running;
        let _ = stop.send(());
        let _ = stopped.await;
        let holder = lease_holder(&self.db).await;
        self.db.close().await;
        crate::helpers::drop_database(&self.db_name, &self.prefix).await;
        holder
    }
}

#[tokio::test]
async fn an_instance_that_stops_gives_the_webhooks_lease_back() {
    let instance = WebhookInstance::start(Mode::Acknowledge, |_| {}).await;
    poll_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        "the instance holds the webhooks' lease",
        || instance.holder(),
        Option::is_some,
    )
    .await;
    // Another instance would take over now, not when the lease runs out.
    assert_eq!(instance.stop().await, None, "the lease was given back");
}

#[tokio::test]
async fn an_instance_that_stops_while_its_receiver_hangs_gives_the_lease_back_at_once() {
    // A delivery may hang for 30 s; the whole shutdown has 2.
    let instance = WebhookInstance::start(Mode::Hang, |s| {
        s.webhook_timeout = Duration::from_secs(30);
        s.shutdown_timeout = Duration::from_secs(2);
    })
    .await;
    let admin = testkit::AdminApi::new(instance.running.base.clone(), ADMIN_TOKEN);
    let now = chrono::Utc::now();
    let voucher = admin
        .create_voucher_from(&json!({
            "title": "hangs", "stock": 1,
            "begin_time": now - chrono::Duration::minutes(1),
            "end_time": now + chrono::Duration::hours(1),
        }))
        .await
        .unwrap();
    let token = admin.tokens_for(&[1], 3600).await.unwrap().remove(0);
    let (status, _) = buy(
        &reqwest::Client::new(),
        &instance.running.base,
        &token,
        voucher,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // The order's event is being delivered to a receiver that hangs.
    instance.receiver.attempted(1).await;
    assert_eq!(
        instance.stop().await,
        None,
        "the lease was given back, not left to run out"
    );
}

#[tokio::test]
async fn without_a_secret_or_with_a_url_that_is_not_http_the_service_refuses_to_start() {
    let base = crate::helpers::settings("postgres://unused", "redis://unused", "x:");
    let mut no_secret = base.clone();
    no_secret.webhook_url = Some("http://127.0.0.1:9/hooks".into());
    assert_refused_to_start(no_secret, "SECKILL_WEBHOOK_SECRET").await;
    let mut not_http = base;
    not_http.webhook_url = Some("ftp://example.test/hooks".into());
    not_http.webhook_secret = Some(WEBHOOK_SECRET.to_owned().into());
    assert_refused_to_start(not_http, "SECKILL_WEBHOOK_URL").await;
}

#[tokio::test]
async fn the_guides_example_receiver_verifies_real_deliveries_and_refuses_a_forged_one_needs_python3(
) {
    use std::io::{BufRead, BufReader};
    let port = testkit::free_port().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/webhook_receiver.py");
    let mut receiver = std::process::Command::new("python3")
        .arg(script)
        .arg(port.to_string())
        .env("SECKILL_WEBHOOK_SECRET", WEBHOOK_SECRET)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs the example receiver");
    let url = format!("http://127.0.0.1:{port}/hooks");
    let client = reqwest::Client::new();
    // Up, and a delivery signed with another secret is refused.
    let forged = poll_until(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "the example receiver listening",
        || async {
            let body = r#"{"events":[]}"#;
            let header = seckill::events::signature(
                b"not-the-secret",
                chrono::Utc::now().timestamp(),
                body.as_bytes(),
            );
            client
                .post(&url)
                .header("x-seckill-signature", header)
                .body(body)
                .send()
                .await
                .map(|r| r.status())
                .ok()
        },
        Option::is_some,
    )
    .await;
    assert_eq!(forged, Some(StatusCode::BAD_REQUEST));

    let app = app_with_webhook(&url, 86_400).await;
    let voucher = app.open_voucher(5).await;
    let order = app.buy_one(&app.base, 1, voucher).await;
    let stdout = receiver.stdout.take().unwrap();
    let (lines, printed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let line = tokio::task::spawn_blocking(move || printed.recv_timeout(Duration::from_secs(15)))
        .await
        .unwrap();
    receiver.kill().unwrap();
    receiver.wait().unwrap();
    let line = line.expect("the example receiver printed an event");
    let event: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(event["type"], "order.created");
    assert_eq!(event["order"]["order_id"], order.as_str());
}
