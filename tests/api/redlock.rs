//! The service with RedLock over three private Redis servers for its user
//! locks (the lock library's own RedLock tests are in `redis-locks/tests`).

use reqwest::StatusCode;

use crate::helpers::{buy, crowd, spawn_app_with, OwnRedis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_guards_users_with_redlock_and_outlives_a_lock_node() {
    let mut nodes: Vec<OwnRedis> = (0..3).map(|_| OwnRedis::start()).collect();
    let urls: Vec<String> = nodes.iter().map(OwnRedis::url).collect();
    let app = spawn_app_with(|mut s| {
        s.lock_redis_urls = urls;
        s
    })
    .await;
    let voucher = app.open_voucher(20).await;
    let tokens = app.tokens(1..=60).await;

    let answers = crowd(&[&app.base], &tokens, voucher, 3).await;
    let sold = answers
        .iter()
        .filter(|(_, s, _)| *s == StatusCode::OK)
        .count();
    assert_eq!(sold, 20);
    for (_, status, code) in &answers {
        assert!(
            *status == StatusCode::OK
                || ["sold_out", "already_purchased", "purchase_in_progress"]
                    .contains(&code.as_str()),
            "{status} {code}"
        );
    }
    assert_eq!(app.check_invariants(voucher).await, 20);

    // One lock node down: a majority is left, purchases go on.
    let next = app.open_voucher(5).await;
    nodes[0].stop();
    let (status, code) = buy(&app.client, &app.base, &tokens[&1], next).await;
    assert_eq!(status, StatusCode::OK, "{code}");
    // Two down: no majority can be had, and that is a 503, not a 429.
    nodes[1].stop();
    let (status, code) = buy(&app.client, &app.base, &tokens[&2], next).await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
    );
    assert_eq!(app.check_invariants(next).await, 1);
}
