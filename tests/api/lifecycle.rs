//! The order lifecycle: pay before the deadline, cancel, expire, and the
//! unit back on sale exactly once, in both sale modes.

use std::time::Duration;

use chrono::Utc;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{
    answer, buy, create_voucher_at, drop_database, notify, pg_server, poll_until, redis_url,
    send_purchase, signature, spawn_app, spawn_app_on_redis, spawn_app_with, start_process,
    start_stoppable, tokens_at, OwnRedis, TestApp,
};

impl TestApp {
    /// A voucher on sale now, with a price and a payment window.
    pub(crate) async fn priced_voucher(
        &self,
        stock: i64,
        mode: &str,
        price: i64,
        pay_within: i64,
    ) -> i64 {
        let priced =
            json!({ "sale_mode": mode, "price_cents": price, "pay_within_seconds": pay_within });
        self.open_voucher_with(stock, priced).await
    }

    /// Buys as `user` through `base`; the order id.
    pub(crate) async fn buy_one(&self, base: &str, user: i64, voucher_id: i64) -> String {
        let token = self.token(user).await;
        let (status, answer) = buy(&self.client, base, &token, voucher_id).await;
        if status == StatusCode::OK {
            return answer.trim_start_matches("ok:").to_owned();
        }
        let response = self
            .client
            .post(format!("{base}/seckill/{voucher_id}"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        panic!(
            "user {user} could not buy: {status} {answer} / {}",
            response.status()
        );
    }

    /// An async purchase as the token's user: the status and the body.
    pub(crate) async fn buy_async(&self, token: &str, voucher_id: i64) -> (StatusCode, Value) {
        let url = self.url(&format!("/seckill/{voucher_id}"));
        let answer = send_purchase(&self.client, &url, token).await;
        (answer.status, answer.body)
    }

    async fn order_as_admin(&self, order_id: &str) -> Value {
        let (status, body) = self.admin_get(&format!("/orders/{order_id}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    /// Waits (bounded) until the order is in `status`.
    pub(crate) async fn wait_status(
        &self,
        order_id: &str,
        status: &str,
        within: Duration,
    ) -> Value {
        let started = std::time::Instant::now();
        loop {
            let order = self.order_as_admin(order_id).await;
            if order["status"] == status {
                return order;
            }
            assert!(
                started.elapsed() < within,
                "order {order_id} still {} after {within:?}",
                order["status"]
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn cancel(
        &self,
        base: &str,
        order_id: &str,
        token: &str,
    ) -> (StatusCode, Value) {
        let url = format!("{base}/orders/{order_id}/cancel");
        answer(self.client.post(url).bearer_auth(token)).await
    }
}

/// `stock + pending + unpaid + paid = initial_stock` in the stats.
/// Asserts the named counts of a voucher's stats, and conservation.
fn assert_books(stats: &Value, expected: &[(&str, i64)]) {
    for (field, want) in expected {
        assert_eq!(stats[*field].as_i64(), Some(*want), "{field} in {stats}");
    }
    assert_conserved(stats);
}

fn assert_conserved(stats: &Value) {
    let n = |field: &str| {
        stats[field]
            .as_i64()
            .unwrap_or_else(|| panic!("{field} in {stats}"))
    };
    assert_eq!(
        n("stock") + n("pending") + n("unpaid") + n("paid"),
        n("initial_stock"),
        "conservation broken: {stats}"
    );
    assert_eq!(n("orders"), n("unpaid") + n("paid"), "{stats}");
}

#[tokio::test]
async fn a_payment_in_time_pays_once_and_every_other_payment_is_refunded() {
    let app = spawn_app().await;
    let voucher = app.priced_voucher(5, "sync", 990, 600).await;
    let (status, body) = app.admin_get(&format!("/vouchers/{voucher}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (
            body["price_cents"].as_i64(),
            body["pay_within_seconds"].as_i64()
        ),
        (Some(990), Some(600))
    );

    let order_id = app.buy_one(&app.base, 7, voucher).await;
    let order = app.order_as_admin(&order_id).await;
    assert_eq!(order["status"], "unpaid");
    assert!(order["paid_at"].is_null());
    let created = order["created_at"]
        .as_str()
        .unwrap()
        .parse::<chrono::DateTime<Utc>>()
        .unwrap();
    let pay_by = order["pay_by"]
        .as_str()
        .unwrap()
        .parse::<chrono::DateTime<Utc>>()
        .unwrap();
    assert_eq!(pay_by - created, chrono::Duration::seconds(600));

    // Unsigned, badly signed, or the wrong amount: nothing changes.
    let body =
        json!({ "payment_id": "p-1", "order_id": order_id, "amount_cents": 990 }).to_string();
    for signature in [
        None,
        Some("sha256=00"),
        Some("sha256=zz"),
        Some(&*signature("{}")),
    ] {
        let mut request = app
            .client
            .post(app.url("/payments/notify"))
            .body(body.clone());
        if let Some(signature) = signature {
            request = request.header("x-signature", signature);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{signature:?}");
        assert_eq!(
            response.json::<Value>().await.unwrap()["error"],
            "unauthorized"
        );
    }
    let (status, body) = notify(&app.client, &app.base, "p-1", &order_id, 989).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request"))
    );
    let (status, body) = notify(&app.client, &app.base, "p-1", "123456789", 990).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    assert_eq!(app.order_as_admin(&order_id).await["status"], "unpaid");

    // Paid; the same payment again answers alike; another is refunded.
    let paid = json!({ "order_id": order_id, "status": "paid", "refund": false });
    for _ in 0..2 {
        let (status, body) = notify(&app.client, &app.base, "p-1", &order_id, 990).await;
        assert_eq!((status, &body), (StatusCode::OK, &paid));
    }
    let (status, body) = notify(&app.client, &app.base, "p-2", &order_id, 990).await;
    assert_eq!(
        (status, body),
        (
            StatusCode::OK,
            json!({ "order_id": order_id, "status": "paid", "refund": true })
        )
    );
    // Money for an order that is paid already is refunded whatever its
    // amount (a wrong amount is refused only where it would pay), and
    // recorded: the same delivery again answers alike.
    let refunded = json!({ "order_id": order_id, "status": "paid", "refund": true });
    for _ in 0..2 {
        let (status, body) = notify(&app.client, &app.base, "p-3", &order_id, 1).await;
        assert_eq!((status, &body), (StatusCode::OK, &refunded));
    }
    // No amount is negative, whatever the order.
    let (status, body) = notify(&app.client, &app.base, "p-4", &order_id, -500).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request"))
    );
    // The payment id names one payment: another order under it is refused.
    let other = app.buy_one(&app.base, 8, voucher).await;
    let (status, body) = notify(&app.client, &app.base, "p-1", &other, 990).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "payment_conflict");
    // So is an order that is not stored under it: the id is taken.
    let (status, body) = notify(&app.client, &app.base, "p-1", "123456789", 990).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("payment_conflict"))
    );

    let order = app.order_as_admin(&order_id).await;
    assert_eq!(order["status"], "paid");
    assert!(order["paid_at"].is_string());
    let token = app.token(7).await;
    let (status, body) = app.cancel(&app.base, &order_id, &token).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_paid"))
    );
    assert_books(
        &app.stats(voucher).await,
        &[("paid", 1), ("unpaid", 1), ("stock", 3)],
    );
    let payments: i64 = sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(payments, 3, "one row per payment id");
    let refund_due: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM order_events WHERE type = 'payment.refund_due' AND order_id = $1",
    )
    .bind(order_id.parse::<i64>().unwrap())
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(refund_due, 2, "p-2 and p-3 are due back");
}

#[tokio::test]
async fn without_a_payment_secret_notifications_are_forbidden() {
    let app = spawn_app_with(|mut s| {
        s.payment_secret = None;
        s
    })
    .await;
    let (status, body) = notify(&app.client, &app.base, "p", "1", 0).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
}

#[tokio::test]
async fn a_cancel_returns_the_unit_once_and_the_other_instance_sells_it_within_a_second() {
    let app = spawn_app().await;
    let other = app.spawn_instance().await;
    let voucher = app.priced_voucher(1, "sync", 0, 600).await;
    let order_id = app.buy_one(&app.base, 1, voucher).await;
    // Sold out, and both instances know it.
    for base in [&app.base, &other] {
        let (status, code) = buy(&app.client, base, &app.token(2).await, voucher).await;
        assert_eq!((status, code.as_str()), (StatusCode::CONFLICT, "sold_out"));
    }

    // Another user's cancel finds no such order; its own user's works, twice.
    let stranger = app.token(2).await;
    let (status, _) = app.cancel(&app.base, &order_id, &stranger).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let owner = app.token(1).await;
    let (status, first) = app.cancel(&app.base, &order_id, &owner).await;
    assert_eq!(
        (status, first["status"].as_str()),
        (StatusCode::OK, Some("cancelled"))
    );
    let (status, again) = app.cancel(&other, &order_id, &owner).await;
    assert_eq!((status, &again), (StatusCode::OK, &first));
    // A client that sends `{}` with every POST is heard; a body that says
    // something is refused, not ignored.
    for (body, expected) in [
        ("{}", StatusCode::OK),
        (r#"{"why":"x"}"#, StatusCode::BAD_REQUEST),
    ] {
        let (status, _) = crate::helpers::answer(
            app.client
                .post(format!("{other}/orders/{order_id}/cancel"))
                .bearer_auth(&owner)
                .header("content-type", "application/json")
                .body(body),
        )
        .await;
        assert_eq!(status, expected, "{body}");
    }
    let returned = std::time::Instant::now();

    // The other instance had it sold out: it sells the unit within a second.
    let token = app.token(2).await;
    let second = loop {
        let (status, answer) = buy(&app.client, &other, &token, voucher).await;
        if status == StatusCode::OK {
            break answer;
        }
        assert_eq!(answer, "sold_out");
        assert!(
            returned.elapsed() < Duration::from_secs(1),
            "not for sale again within a second"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(second.starts_with("ok:"));
    // One unit went back, once: the first buyer may buy again, finds it gone.
    let (status, code) = buy(&app.client, &app.base, &owner, voucher).await;
    assert_eq!((status, code.as_str()), (StatusCode::CONFLICT, "sold_out"));
    // A payment for the cancelled order is recorded and refunded.
    let (status, body) = notify(&app.client, &app.base, "late", &order_id, 0).await;
    assert_eq!(
        (status, body["status"].as_str(), body["refund"].as_bool()),
        (StatusCode::OK, Some("cancelled"), Some(true))
    );

    assert_books(
        &app.stats(voucher).await,
        &[("cancelled", 1), ("unpaid", 1), ("stock", 0)],
    );
    assert_eq!(app.check_invariants(voucher).await, 1);
}

#[tokio::test]
async fn unpaid_orders_expire_at_their_deadline_and_their_buyers_may_buy_again() {
    let app = spawn_app().await;
    let before = app.metrics().await;
    let before_expired = counted(&before, "seckill_expirations_total");
    let before_lateness = counted(&before, "seckill_expiry_lateness_seconds_count");
    let voucher = app.priced_voucher(3, "sync", 100, 1).await;
    let mut orders = Vec::new();
    for user in 1..=3 {
        orders.push(app.buy_one(&app.base, user, voucher).await);
    }
    assert_eq!(app.stats(voucher).await["stock"], 0);
    for order in &orders {
        let expired = app
            .wait_status(order, "expired", Duration::from_secs(3))
            .await;
        assert!(expired["paid_at"].is_null());
    }
    assert_books(&app.stats(voucher).await, &[("expired", 3), ("stock", 3)]);
    // A payment after the deadline is refunded; a cancel says it expired.
    let (status, body) = notify(&app.client, &app.base, "too-late", &orders[0], 100).await;
    assert_eq!(
        (status, body["status"].as_str(), body["refund"].as_bool()),
        (StatusCode::OK, Some("expired"), Some(true))
    );
    let (status, body) = app.cancel(&app.base, &orders[0], &app.token(1).await).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("order_expired"))
    );
    // The user of an expired order may buy again.
    let again = app.buy_one(&app.base, 1, voucher).await;
    assert_ne!(again, orders[0]);
    // The recorder is the process's: other tests' expirations count too.
    let after = app.metrics().await;
    assert!(counted(&after, "seckill_expirations_total") >= before_expired + 3.0);
    assert!(counted(&after, "seckill_expiry_lateness_seconds_count") >= before_lateness + 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_held_locked_does_not_hold_up_the_expiry_of_other_vouchers() {
    // The sweep takes the voucher of the earliest due order; while another
    // transaction holds that order (a payment stuck mid-way, an instance
    // frozen in its transaction), the sweep goes on to the next voucher
    // instead of finding the held one again and again.
    let app = spawn_app().await;
    let held_voucher = app.priced_voucher(1, "sync", 100, 1).await;
    let held = app.buy_one(&app.base, 1, held_voucher).await;
    let mut holder = app.db.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM voucher_orders WHERE id = $1 FOR UPDATE")
        .bind(held.parse::<i64>().unwrap())
        .execute(&mut *holder)
        .await
        .unwrap();
    let other_voucher = app.priced_voucher(1, "sync", 100, 1).await;
    let other = app.buy_one(&app.base, 2, other_voucher).await;
    app.wait_status(&other, "expired", Duration::from_secs(5))
        .await;
    let (status, body) = app.admin_get(&format!("/orders/{held}")).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("unpaid"))
    );
    holder.rollback().await.unwrap();
    app.wait_status(&held, "expired", Duration::from_secs(5))
        .await;
}

/// A metric's value on the `/metrics` page (0 when it is not there).
fn counted(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|line| {
            line.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_payment_and_a_cancel_racing_the_deadline_have_exactly_one_winner_per_order() {
    let app = spawn_app().await;
    let other = app.spawn_instance().await;
    let voucher = app.priced_voucher(60, "sync", 5, 3).await;
    let mut orders = Vec::new();
    for user in 1..=60 {
        orders.push((user, app.buy_one(&app.base, user, voucher).await));
    }
    // Each order's payment lands within 150 ms of its deadline, delivered
    // twice, to both instances at once, with a cancel beside it for every
    // third order.
    let mut races = Vec::new();
    for (i, (user, order)) in orders.iter().enumerate() {
        let pay_by = app.order_as_admin(order).await["pay_by"]
            .as_str()
            .unwrap()
            .parse::<chrono::DateTime<Utc>>()
            .unwrap();
        let at = pay_by + chrono::Duration::milliseconds((i as i64 % 7) * 50 - 150);
        let (client, a, b, order, user) = (
            app.client.clone(),
            app.base.clone(),
            other.clone(),
            order.clone(),
            *user,
        );
        let token = app.token(user).await;
        races.push(tokio::spawn(async move {
            tokio::time::sleep((at - Utc::now()).to_std().unwrap_or_default()).await;
            let payment = format!("pay-{order}");
            let cancel = async {
                if i % 3 == 0 {
                    let response = client
                        .post(format!("{a}/orders/{order}/cancel"))
                        .bearer_auth(&token)
                        .send()
                        .await
                        .unwrap();
                    Some(response.status())
                } else {
                    None
                }
            };
            let (x, y, cancelled) = tokio::join!(
                notify(&client, &a, &payment, &order, 5),
                notify(&client, &b, &payment, &order, 5),
                cancel
            );
            (order, x, y, cancelled)
        }));
    }
    for race in races {
        let (order, x, y, cancelled) = race.await.unwrap();
        assert_eq!(x.0, StatusCode::OK, "{}", x.1);
        assert_eq!(x, y, "two deliveries of one payment answered differently");
        let stored = app.order_as_admin(&order).await;
        let status = stored["status"].as_str().unwrap();
        let paid = x.1["refund"] == false;
        match status {
            "paid" => assert!(paid && cancelled != Some(StatusCode::OK)),
            "cancelled" => assert!(!paid && cancelled == Some(StatusCode::OK)),
            // Expired on its own, or by a payment that came late; a
            // cancel that came late said so.
            "expired" => assert!(!paid && cancelled.is_none_or(|c| c == StatusCode::CONFLICT)),
            other => panic!("order {order} ended {other}"),
        }
    }
    // Every order closed or paid; the units of the closed ones back, once.
    assert_books(&app.stats(voucher).await, &[("unpaid", 0)]);
    let (returned, closed): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT returned FROM seckill_vouchers WHERE voucher_id = $1),
                (SELECT count(*) FROM voucher_orders WHERE voucher_id = $1 AND status IN ('cancelled', 'expired'))",
    )
    .bind(voucher)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(returned, closed, "a unit went back more or less than once");
}

#[tokio::test]
async fn a_restarted_instance_expires_the_deadlines_that_passed_while_it_was_down() {
    // The only instance sells, then stops before the deadline passes.
    let db_name = format!("seckill_test_{}", uuid::Uuid::new_v4().simple());
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let db_url = format!("{}/{db_name}", pg_server());
    let settings = crate::helpers::settings(&db_url, &redis_url(), &prefix);
    let client = crate::helpers::client();
    let mut running = start_stoppable(settings.clone()).await;
    let base = running.base.clone();
    let now = Utc::now();
    let voucher = create_voucher_at(
        &client,
        &base,
        json!({
            "title": "restart", "stock": 2, "pay_within_seconds": 1,
            "begin_time": now - chrono::Duration::minutes(1),
            "end_time": now + chrono::Duration::hours(1),
        }),
    )
    .await;
    let token = tokens_at(&client, &base, [1]).await.remove(&1).unwrap();
    let (status, order) = buy(&client, &base, &token, voucher).await;
    assert_eq!(status, StatusCode::OK);
    let order = order.trim_start_matches("ok:").to_owned();
    let _ = running.stop.send(());
    let _ = (&mut running.stopped).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let db = sqlx::PgPool::connect(&db_url).await.unwrap();
    let status_now = || async {
        sqlx::query_scalar::<_, String>("SELECT status FROM voucher_orders WHERE id = $1")
            .bind(order.parse::<i64>().unwrap())
            .fetch_one(&db)
            .await
            .unwrap()
    };
    assert_eq!(
        status_now().await,
        "unpaid",
        "nothing expires while no instance runs"
    );
    let mut restarted = start_stoppable(settings).await;
    let ready = std::time::Instant::now();
    let answer = client
        .get(format!("{}/readyz", restarted.base))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    while status_now().await != "expired" {
        assert!(
            ready.elapsed() < Duration::from_secs(2),
            "not expired within 2 s of readiness"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stock: i32 = sqlx::query_scalar("SELECT stock FROM seckill_vouchers WHERE voucher_id = $1")
        .bind(voucher)
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(stock, 2);
    db.close().await;
    let _ = restarted.stop.send(());
    let _ = (&mut restarted.stopped).await;
    drop_database(&db_name, &prefix).await;
}

#[tokio::test]
async fn an_async_sale_gives_a_cancelled_unit_back_to_redis_once_even_across_a_reconciliation() {
    let app = spawn_app().await;
    let voucher = app.priced_voucher(2, "async", 0, 600).await;
    let mut orders = Vec::new();
    for user in [1, 2] {
        let (status, body) = app.buy_async(&app.token(user).await, voucher).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        orders.push(body["order_id"].as_str().unwrap().to_owned());
    }
    // A pending order cannot be cancelled or paid yet (or is stored by now).
    for order in &orders {
        app.wait_status(order, "unpaid", Duration::from_secs(5))
            .await;
    }
    let (status, code) = buy(&app.client, &app.base, &app.token(3).await, voucher).await;
    assert_eq!((status, code.as_str()), (StatusCode::CONFLICT, "sold_out"));

    // Redis loses the sale (as a restart without persistence would) while
    // a cancel's return is on its way to it.
    let keyspace = app.keyspace().await;
    let sale_key = seckill::kv::Keys::new(keyspace.as_str())
        .async_sale(seckill::domain::VoucherId::new(voucher).unwrap())
        .sale;
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&sale_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (status, body) = app.cancel(&app.base, &orders[0], &app.token(1).await).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("cancelled"))
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (status, _) = app.reconcile(voucher).await;
    assert_eq!(status, StatusCode::OK);
    // The queued return reaches Redis after the reconciliation counted it:
    // it changes nothing (the lease lets the relay try again in 2 s).
    tokio::time::sleep(Duration::from_millis(2_800)).await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM stock_returns")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(left, 0, "the return was never taken off the queue");
    let stock: i64 = redis::cmd("HGET")
        .arg(&sale_key)
        .arg("stock")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(stock, 1, "the returned unit counted other than once");

    // The cancelling user may buy again; then the sale is sold out.
    let (status, _) = app.buy_async(&app.token(1).await, voucher).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, code) = buy(&app.client, &app.base, &app.token(3).await, voucher).await;
    assert_eq!((status, code.as_str()), (StatusCode::CONFLICT, "sold_out"));
    assert_books(&app.stats(voucher).await, &[("cancelled", 1)]);
}

#[tokio::test]
async fn an_async_cancel_puts_the_unit_back_on_sale_in_redis_within_a_second() {
    let app = spawn_app().await;
    let voucher = app.priced_voucher(1, "async", 0, 600).await;
    let token = app.token(1).await;
    let (status, body) = app.buy_async(&token, voucher).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let order = body["order_id"].as_str().unwrap().to_owned();
    app.wait_status(&order, "unpaid", Duration::from_secs(5))
        .await;
    let (status, _) = app.cancel(&app.base, &order, &token).await;
    assert_eq!(status, StatusCode::OK);
    let returned = std::time::Instant::now();
    let other = app.token(2).await;
    loop {
        let (status, body) = app.buy_async(&other, voucher).await;
        if status == StatusCode::ACCEPTED {
            break;
        }
        assert_eq!(body["error"], "sold_out");
        assert!(
            returned.elapsed() < Duration::from_secs(1),
            "not for sale again within a second"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = app.stats(voucher).await;
    assert_conserved(&stats);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_sale_whose_redis_restarts_with_returns_in_flight_sells_each_returned_unit_once() {
    let mut redis = OwnRedis::start();
    let url = redis.url();
    let app = spawn_app_on_redis(url, Some(1_000)).await;
    let voucher = app.priced_voucher(10, "async", 0, 600).await;
    let tokens = app.tokens(1..=30).await;
    let mut orders = Vec::new();
    for user in 1..=10 {
        let (status, body) = app.buy_async(&tokens[&user], voucher).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        orders.push(body["order_id"].as_str().unwrap().to_owned());
    }
    for order in &orders {
        app.wait_status(order, "unpaid", Duration::from_secs(10))
            .await;
    }
    // Two returns reach Redis normally; three are made while it is down
    // (they wait in the outbox), then it comes back empty and two more are
    // made before the sale is reconciled.
    let cancel = |i: usize| {
        let (app, order, token) = (&app, orders[i].clone(), tokens[&(i as i64 + 1)].clone());
        async move {
            let (status, body) = app.cancel(&app.base, &order, &token).await;
            assert_eq!(
                (status, body["status"].as_str()),
                (StatusCode::OK, Some("cancelled")),
                "{body}"
            );
        }
    };
    cancel(0).await;
    cancel(1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.stop();
    for i in 2..5 {
        cancel(i).await;
    }
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM stock_returns")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(
        queued, 3,
        "returns made while Redis is down wait in the outbox"
    );
    redis.restart();
    app.wait_ready().await;
    for i in 5..7 {
        cancel(i).await;
    }
    let (status, report) = app.reconcile(voucher).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["stock"], 7, "{report}");
    assert_eq!(report["buyers"], 3, "{report}");
    // The relay delivers what was queued (again, after its claim lapses):
    // the reconciled sale counts each of those units once already.
    let still_queued = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM stock_returns")
            .fetch_one(&app.db)
            .await
            .unwrap()
    };
    poll_until(
        Duration::from_secs(10),
        Duration::from_millis(100),
        "returns still queued",
        still_queued,
        |left| *left == 0,
    )
    .await;
    // Exactly the seven returned units sell, to whoever comes: the buyers
    // who cancelled may buy again, the three who did not are refused.
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    for user in (1..=10).chain(11..=30) {
        let (status, body) = app.buy_async(&tokens[&user], voucher).await;
        match status {
            StatusCode::ACCEPTED => accepted.push(body["order_id"].as_str().unwrap().to_owned()),
            StatusCode::CONFLICT => {
                refused.push((user, body["error"].as_str().unwrap().to_owned()))
            }
            other => panic!("user {user}: {other} {body}"),
        }
    }
    assert_eq!(accepted.len(), 7, "refused: {refused:?}");
    let already: Vec<i64> = refused
        .iter()
        .filter(|(_, e)| e == "already_purchased")
        .map(|(u, _)| *u)
        .collect();
    assert_eq!(already, vec![8, 9, 10], "{refused:?}");
    for order in &accepted {
        app.wait_status(order, "unpaid", Duration::from_secs(10))
            .await;
    }
    assert_books(
        &app.stats(voucher).await,
        &[("stock", 0), ("cancelled", 7), ("orders", 10)],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_instance_killed_while_deadlines_pass_loses_no_expiry() {
    // Two instances, run as processes and killed (no shutdown), sell
    // orders due in a second; a fresh instance expires them all.
    let db_name = format!("seckill_test_{}", uuid::Uuid::new_v4().simple());
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let db_url = format!("{}/{db_name}", pg_server());
    let mut first = start_process(&db_url, &redis_url(), &prefix, &[]).await;
    let mut second = start_process(&db_url, &redis_url(), &prefix, &[]).await;
    let client = crate::helpers::client();
    let now = Utc::now();
    let voucher = create_voucher_at(
        &client,
        first.base(),
        json!({
            "title": "killed", "stock": 40, "pay_within_seconds": 1,
            "begin_time": now - chrono::Duration::minutes(1),
            "end_time": now + chrono::Duration::hours(1),
        }),
    )
    .await;
    let tokens = tokens_at(&client, first.base(), 1..=40).await;
    for (user, token) in &tokens {
        let base = if user % 2 == 0 {
            first.base()
        } else {
            second.base()
        };
        let (status, answer) = buy(&client, base, token, voucher).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    first.kill();
    second.kill();
    let db = sqlx::PgPool::connect(&db_url).await.unwrap();
    let unpaid = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM voucher_orders WHERE voucher_id = $1 AND status = 'unpaid'",
        )
        .bind(voucher)
        .fetch_one(&db)
        .await
        .unwrap()
    };
    // On a busy machine the first orders may fall due, and be expired,
    // before the last is sold: what is left unpaid at the kill stays so.
    let at_kill = unpaid().await;
    assert!(at_kill > 0, "every order expired before the instances died");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        unpaid().await,
        at_kill,
        "nothing expires while no instance runs"
    );
    let third = start_process(&db_url, &redis_url(), &prefix, &[]).await;
    let ready = std::time::Instant::now();
    while unpaid().await > 0 {
        assert!(
            ready.elapsed() < Duration::from_secs(2),
            "not all expired within 2 s of readiness"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (stock, returned): (i32, i64) =
        sqlx::query_as("SELECT stock, returned FROM seckill_vouchers WHERE voucher_id = $1")
            .bind(voucher)
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!((stock, returned), (40, 40), "each unit back exactly once");
    // And on sale again through the new instance.
    let (status, answer) = buy(&client, third.base(), &tokens[&1], voucher).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    drop(third);
    db.close().await;
    drop_database(&db_name, &prefix).await;
}
