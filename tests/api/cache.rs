//! Cacheable reads: `GET /vouchers/{id}` and `GET /vouchers` tell a cache in
//! front how long it may keep them, tag what they say, and answer `304` to
//! a client whose tag is current.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::{CACHE_CONTROL, ETAG, IF_NONE_MATCH};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, TestApp};

/// `GET path`, with `If-None-Match: tag` when given: the status, the
/// `Cache-Control` and `ETag` headers, and the body's text.
async fn read(
    app: &TestApp,
    path: &str,
    tag: Option<&str>,
) -> (StatusCode, String, String, String) {
    let mut request = app.client.get(app.url(path));
    if let Some(tag) = tag {
        request = request.header(IF_NONE_MATCH, tag);
    }
    let response = request.send().await.expect("GET");
    let header = |name| {
        response
            .headers()
            .get(name)
            .map(|v: &reqwest::header::HeaderValue| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (cache, etag) = (header(CACHE_CONTROL), header(ETAG));
    let status = response.status();
    (status, cache, etag, response.text().await.unwrap())
}

#[tokio::test]
async fn a_voucher_read_is_public_for_a_second_tagged_and_answered_304_while_unchanged() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(5).await;
    let path = format!("/vouchers/{voucher}");
    let (status, cache, etag, body) = read(&app, &path, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(cache.contains("public"), "{cache}");
    assert!(cache.contains("max-age=1"), "{cache}");
    assert!(cache.contains("stale-while-revalidate=1"), "{cache}");
    assert!(
        etag.starts_with('"') && etag.ends_with('"'),
        "a strong tag: {etag}"
    );

    let (status, cache, again, body) = read(&app, &path, Some(&etag)).await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert_eq!((again.as_str(), body.as_str()), (etag.as_str(), ""));
    assert!(cache.contains("max-age=1"), "{cache}");
    // A list of tags, and the weak form of ours, match too.
    let listed = format!("\"0\", W/{etag}");
    assert_eq!(
        read(&app, &path, Some(&listed)).await.0,
        StatusCode::NOT_MODIFIED
    );
    assert_eq!(read(&app, &path, Some("\"0\"")).await.0, StatusCode::OK);

    // A purchase changes the stock: once the read shows it, the old tag is
    // answered in full with a new one.
    app.buy_one(&app.base, 1, voucher).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _, changed, body) = read(&app, &path, Some(&etag)).await;
    assert_eq!(status, StatusCode::OK);
    assert_ne!(changed, etag);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["stock"], 4);

    // An unknown voucher is not cached.
    let (status, cache, etag, _) = read(&app, "/vouchers/999999", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!((cache.as_str(), etag.as_str()), ("", ""));
}

#[tokio::test]
async fn the_list_holds_the_vouchers_on_sale_and_coming_with_the_servers_time() {
    let app = spawn_app().await;
    let now = Utc::now();
    let on_sale = app.open_voucher(3).await;
    let coming = app
        .create_voucher_from(json!({
            "title": "coming", "stock": 7,
            "begin_time": now + chrono::Duration::hours(1),
            "end_time": now + chrono::Duration::hours(2),
        }))
        .await;
    let ended = app
        .create_voucher_from(json!({
            "title": "ended", "stock": 7,
            "begin_time": now - chrono::Duration::hours(2),
            "end_time": now - chrono::Duration::hours(1),
        }))
        .await;
    let (status, cache, etag, body) = read(&app, "/vouchers", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        cache.contains("public") && cache.contains("max-age=1"),
        "{cache}"
    );
    assert!(
        etag.starts_with("W/\""),
        "a weak tag (the time changes): {etag}"
    );
    let body: Value = serde_json::from_str(&body).unwrap();
    let server_time: DateTime<Utc> = body["server_time"].as_str().unwrap().parse().unwrap();
    assert!(
        (Utc::now() - server_time).num_seconds().abs() <= 2,
        "{server_time}"
    );
    let vouchers = body["vouchers"].as_array().unwrap();
    let ids: Vec<i64> = vouchers.iter().map(|v| v["id"].as_i64().unwrap()).collect();
    assert_eq!(
        ids,
        vec![on_sale, coming],
        "on sale first, then coming; not the ended {ended}"
    );
    let (_, one) = app.get_as(&format!("/vouchers/{coming}"), "").await;
    assert_eq!(vouchers[1], one, "each as GET /vouchers/{{id}} shows it");

    // The same vouchers a moment later: the same tag, answered 304.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (status, _, again, body) = read(&app, "/vouchers", Some(&etag)).await;
    assert_eq!(
        (status, again.as_str(), body.as_str()),
        (StatusCode::NOT_MODIFIED, etag.as_str(), "")
    );
    // A sale changes the list within a second, and its tag.
    app.buy_one(&app.base, 1, on_sale).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (status, _, changed, body) = read(&app, "/vouchers", Some(&etag)).await;
    assert_eq!(status, StatusCode::OK);
    assert_ne!(changed, etag);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["vouchers"][0]["stock"], 2);
}

#[tokio::test]
async fn past_its_bound_the_list_keeps_the_sales_that_began_last_and_the_next_to_start() {
    // As many long sales as the list holds, begun a day ago, then one that
    // opens now and one that starts in an hour: both are listed (the list
    // held the first to start, so the new sale and the coming one were
    // left out however they were looked for).
    let app = spawn_app().await;
    let now = Utc::now();
    let (begin, end) = (
        now - chrono::Duration::days(1),
        now + chrono::Duration::days(7),
    );
    let bound = seckill::seckill::LISTED_VOUCHERS;
    let long: Vec<i64> = futures_util::future::join_all((0..bound).map(|n| {
        app.create_voucher_from(json!({
            "title": format!("long {n}"), "stock": 1,
            "begin_time": begin, "end_time": end,
        }))
    }))
    .await;
    let fresh = app.open_voucher(3).await;
    let coming = app
        .create_voucher_from(json!({
            "title": "coming", "stock": 1,
            "begin_time": now + chrono::Duration::hours(1),
            "end_time": now + chrono::Duration::hours(2),
        }))
        .await;
    let (status, _, _, body) = read(&app, "/vouchers", None).await;
    assert_eq!(status, StatusCode::OK);
    let body: Value = serde_json::from_str(&body).unwrap();
    let ids: Vec<i64> = body["vouchers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids.len() as i64, bound);
    // On sale by start, the newest last of them; then the coming one.
    assert_eq!(&ids[ids.len() - 2..], &[fresh, coming], "{ids:?}");
    // Of the long ones, the two made first (same start, lowest ids) left.
    let mut by_age = long.clone();
    by_age.sort();
    assert!(
        !ids.contains(&by_age[0]) && !ids.contains(&by_age[1]),
        "{ids:?}"
    );
    assert!(ids.contains(&by_age[2]), "{ids:?}");
}

#[tokio::test]
async fn made_up_voucher_ids_are_answered_from_the_highest_id_not_one_query_each() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(5).await;
    let other = app.spawn_instance().await;
    // A voucher's row is read with its sale's: while that table is locked,
    // a read of a voucher waits (and times out), but a made-up id above
    // the highest is answered without it.
    let mut hold = app.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE seckill_vouchers IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *hold)
        .await
        .unwrap();
    let reads = (0..50_i64).map(|i| {
        let url = app.url(&format!("/vouchers/{}", 1_000_000_000 + i * 7_919));
        let client = app.client.clone();
        async move { client.get(url).send().await.unwrap().status() }
    });
    let answers = tokio::time::timeout(
        Duration::from_secs(1),
        futures_util::future::join_all(reads),
    )
    .await
    .expect("made-up ids waited for the voucher table (one query each, before)");
    assert!(
        answers.iter().all(|s| *s == StatusCode::NOT_FOUND),
        "{answers:?}"
    );
    hold.rollback().await.unwrap();

    // A voucher made on another instance is found there too, once its
    // highest id is read again (at most every 50 ms).
    let above = format!("/vouchers/{}", voucher + 1);
    assert_eq!(read(&app, &above, None).await.0, StatusCode::NOT_FOUND);
    let (status, _) = crate::helpers::answer(
        app.client
            .get(format!("{other}/vouchers/{}", voucher + 1_000)),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let made = app.open_voucher(5).await;
    assert_eq!(
        read(&app, &format!("/vouchers/{made}"), None).await.0,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(60)).await;
    let (status, body) =
        crate::helpers::answer(app.client.get(format!("{other}/vouchers/{made}"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
