//! The shipped front (`deploy/nginx.conf`, run by `testkit::Front`): a read
//! flood from many addresses reaches the instance at about one request per
//! voucher per second, and everything else passes through.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{answer, spawn_app, TestApp};

/// `GET /vouchers/{id}` requests the instance itself answered, by its own
/// request counter.
async fn origin_reads(app: &TestApp) -> u64 {
    app.metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("http_requests_total{") && l.contains("route=\"/vouchers/{id}\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test]
async fn a_read_flood_through_the_front_reaches_the_instance_about_once_per_voucher_and_second_needs_nginx(
) {
    let app = spawn_app().await;
    let vouchers = [app.open_voucher(10).await, app.open_voucher(10).await];
    let origin: SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let front = testkit::Front::start(&[origin]).expect("the front starts");
    let base = front.base();

    let before = origin_reads(&app).await;
    let seconds = 3;
    let answered = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(seconds);
    let flood: Vec<_> = (0..32u32)
        .map(|i| {
            let (client, base, answered) = (app.client.clone(), base.clone(), answered.clone());
            let voucher = vouchers[i as usize % 2];
            tokio::spawn(async move {
                let mut n = 0u32;
                while Instant::now() < until {
                    n += 1;
                    // A botnet: every request from another address.
                    let response = client
                        .get(format!("{base}/vouchers/{voucher}"))
                        .header(
                            "x-forwarded-for",
                            format!("10.{}.{}.{}", i, n >> 8 & 255, n & 255),
                        )
                        .send()
                        .await
                        .expect("the front answers");
                    assert_eq!(response.status(), StatusCode::OK);
                    let body: Value = response.json().await.unwrap();
                    assert_eq!(body["id"], voucher);
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in flood {
        task.await.unwrap();
    }
    let reached = origin_reads(&app).await - before;
    let answered = answered.load(Ordering::Relaxed);
    eprintln!("front: {answered} reads answered in {seconds} s, {reached} reached the instance");
    // One fill and about one refresh per voucher and second; twice that
    // leaves room for a refresh at each second's edge.
    let bound = 2 * vouchers.len() as u64 * (seconds + 1);
    assert!(
        reached <= bound,
        "{reached} of {answered} reads reached the instance (at most {bound})"
    );
    assert!(
        answered >= 10 * bound,
        "the flood was a flood: {answered} answers"
    );

    // A purchase goes through, and the front shows its stock within the
    // answer's lifetime.
    let token = app.token(1).await;
    let response = app
        .client
        .post(format!("{base}/seckill/{}", vouchers[0]))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    crate::helpers::poll_until(
        Duration::from_secs(5),
        Duration::from_millis(200),
        "the front shows the new stock",
        || async {
            let (_, body) =
                answer(app.client.get(format!("{base}/vouchers/{}", vouchers[0]))).await;
            body["stock"].as_i64()
        },
        |stock| *stock == Some(9),
    )
    .await;

    // A reader who comes after a quiet spell is not served the copy kept
    // since the last one, nor its server time: at most a second stale.
    for path in ["/vouchers".to_owned(), format!("/vouchers/{}", vouchers[1])] {
        answer(app.client.get(format!("{base}{path}"))).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, list) = answer(app.client.get(format!("{base}/vouchers"))).await;
    assert_eq!(status, StatusCode::OK);
    let server_time: chrono::DateTime<chrono::Utc> =
        list["server_time"].as_str().unwrap().parse().unwrap();
    let age = chrono::Utc::now() - server_time;
    assert!(
        age <= chrono::Duration::milliseconds(1_500),
        "the list is {age} old"
    );
}
