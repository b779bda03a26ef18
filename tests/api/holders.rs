//! A buyer who holds a live order is refused `already_purchased` from
//! memory on every instance (no lock taken, no Redis script run), and let
//! buy again on every instance within a second once the order is closed.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{answer, buy, poll_until, spawn_app_on_own_redis};

#[tokio::test]
async fn a_holder_is_refused_from_memory_on_every_instance_until_the_order_closes() {
    let (redis, app) = spawn_app_on_own_redis(None).await;
    let other = app.spawn_instance().await;
    let voucher = app.open_voucher(10).await;
    let token = app.token(1).await;
    let (status, bought) = buy(&app.client, &app.base, &token, voucher).await;
    assert_eq!(status, StatusCode::OK, "{bought}");
    let order = bought.trim_start_matches("ok:").to_owned();

    // The other instance learns of the order from the order events: twenty
    // refusals there run no script in Redis (a purchase that took the
    // user's lock would run two each).
    let conn = testkit::redis_conn(&redis.url()).await;
    let scripts = || {
        let mut conn = conn.clone();
        async move {
            testkit::command_calls(&mut conn, "evalsha").await
                + testkit::command_calls(&mut conn, "eval").await
        }
    };
    let purchase = |base: String| {
        let (client, token) = (app.client.clone(), token.clone());
        async move {
            answer(
                client
                    .post(format!("{base}/seckill/{voucher}"))
                    .bearer_auth(&token),
            )
            .await
        }
    };
    // A second is four reads of the events: the other instance has not
    // seen the buyer, and refuses the first purchase from memory too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = scripts().await;
    let mut answers = Vec::new();
    for _ in 0..20 {
        answers.push(purchase(other.clone()).await);
    }
    let ran = (answers, scripts().await - before);
    assert!(ran.1 < 5, "{} scripts ran for twenty refusals", ran.1);
    for (status, body) in &ran.0 {
        assert_eq!(*status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"], "already_purchased");
        assert_eq!(body["order_id"], Value::from(order.clone()));
    }

    // Cancelled on the first instance: it lets the buyer buy again at
    // once, the other within a second (one read of the events).
    let (status, body) = app
        .post_as(&format!("/orders/{order}/cancel"), &token)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let cancelled = std::time::Instant::now();
    let (status, body) = poll_until(
        Duration::from_secs(3),
        Duration::from_millis(50),
        "the other instance lets the buyer buy again",
        || purchase(other.clone()),
        |(status, _)| *status != StatusCode::CONFLICT,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        cancelled.elapsed() < Duration::from_secs(2),
        "{:?}",
        cancelled.elapsed()
    );
}
