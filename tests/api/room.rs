//! The waiting room end to end: one place per user, the pre-queue placed at
//! random at the start and later joiners in order of arrival, admission at
//! the room's pace, and no purchase without an admitted ticket.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use chrono::Utc;
use reqwest::StatusCode;
use seckill::domain::{UserId, VoucherId};
use serde_json::{json, Value};

use crate::helpers::{answer, poll_until, spawn_app, TestApp};

async fn join(app: &TestApp, voucher: i64, token: &str) -> (StatusCode, Value) {
    let url = app.url(&format!("/vouchers/{voucher}/queue"));
    answer(app.client.post(url).bearer_auth(token)).await
}

async fn poll(app: &TestApp, voucher: i64, token: &str, ticket: &str) -> (StatusCode, Value) {
    let url = app.url(&format!("/vouchers/{voucher}/queue"));
    answer(
        app.client
            .get(url)
            .bearer_auth(token)
            .header("x-queue-ticket", ticket),
    )
    .await
}

/// The ticket of an answer of the queue.
fn ticket(body: &Value) -> &str {
    body["ticket"].as_str().unwrap()
}

async fn buy_with(
    app: &TestApp,
    voucher: i64,
    token: &str,
    ticket: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = app
        .client
        .post(app.url(&format!("/seckill/{voucher}")))
        .bearer_auth(token);
    if let Some(ticket) = ticket {
        request = request.header("x-queue-ticket", ticket);
    }
    answer(request).await
}

/// A voucher with a room, on sale from `starts_in` from now for an hour.
async fn room_voucher(app: &TestApp, stock: i64, rate: i64, starts_in: chrono::Duration) -> i64 {
    let begin = Utc::now() + starts_in;
    app.create_voucher_from(json!({
        "title": "room", "stock": stock,
        "begin_time": begin, "end_time": begin + chrono::Duration::hours(1),
        "waiting_room": { "admit_per_second": rate },
    }))
    .await
}

#[tokio::test]
async fn a_voucher_without_a_room_has_no_queue_and_shows_none() {
    let app = spawn_app().await;
    let voucher = app.open_voucher(3).await;
    let token = app.token(1).await;
    let (status, body) = join(&app, voucher, &token).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // A poll too, whatever ticket it carries: there is no room to be in.
    let (status, body) = poll(&app, voucher, &token, "not-a-ticket").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (_, shown) = answer(app.client.get(app.url(&format!("/vouchers/{voucher}")))).await;
    assert_eq!(shown["waiting_room"], Value::Null);
    // And it sells as before, without a ticket.
    assert_eq!(
        buy_with(&app, voucher, &token, None).await.0,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pre_queue_is_placed_at_random_at_the_start_and_later_joiners_in_order() {
    let app = spawn_app().await;
    let voucher = room_voucher(&app, 100, 1, chrono::Duration::seconds(3)).await;
    let (_, shown) = answer(app.client.get(app.url(&format!("/vouchers/{voucher}")))).await;
    assert_eq!(
        shown["waiting_room"],
        json!({ "admit_per_second": 1, "proof_of_work_bits": 0 })
    );
    let tokens = app.tokens(1..=30).await;
    // Twenty join before the start, each twice: no place yet, one each.
    let mut tickets = HashMap::new();
    for user in 1..=20 {
        let (status, body) = join(&app, voucher, &tokens[&user]).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["status"], "waiting");
        assert_eq!(body["place"], Value::Null, "{body}");
        let (_, again) = join(&app, voucher, &tokens[&user]).await;
        assert_eq!(again["place"], Value::Null);
        tickets.insert(user, ticket(&body).to_owned());
    }
    // Not admitted: no purchase, before or after the start.
    let (status, body) = buy_with(&app, voucher, &tokens[&1], Some(&tickets[&1])).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"], "not_admitted");

    // After the start, every pre-queue joiner has a place among the first
    // twenty, each a different one, in an order that is not the joins'.
    poll_until(
        Duration::from_secs(10),
        Duration::from_millis(200),
        "never placed",
        || async { poll(&app, voucher, &tokens[&1], &tickets[&1]).await.1 },
        |body| !body["place"].is_null(),
    )
    .await;
    let mut places = Vec::new();
    for user in 1..=20 {
        let (status, body) = poll(&app, voucher, &tokens[&user], &tickets[&user]).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        places.push(body["place"].as_i64().unwrap());
    }
    let distinct: BTreeSet<i64> = places.iter().copied().collect();
    assert_eq!(distinct, (1..=20).collect(), "{places:?}");
    assert_ne!(
        places,
        (1..=20).collect::<Vec<_>>(),
        "placed in the order of joining"
    );
    // Later joiners: in order of arrival, after the pre-queue; again the
    // same place.
    for user in 21..=30 {
        let (status, body) = join(&app, voucher, &tokens[&user]).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["place"], user, "{body}");
        let (_, again) = join(&app, voucher, &tokens[&user]).await;
        assert_eq!(again["place"], user);
    }
    // A ticket polls only for its own user and voucher.
    let (status, _) = poll(&app, voucher, &tokens[&2], &tickets[&1]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_admitted_ticket_buys_and_admission_keeps_the_rooms_pace() {
    let app = spawn_app().await;
    let rate = 2;
    let voucher = room_voucher(&app, 100, rate, chrono::Duration::seconds(-1)).await;
    let tokens = app.tokens(1..=8).await;
    let began = Instant::now();
    let mut tickets = HashMap::new();
    for user in 1..=8 {
        let (status, body) = join(&app, voucher, &tokens[&user]).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        tickets.insert(user, ticket(&body).to_owned());
    }
    // Without a ticket, with a waiting one, with a forged one, with
    // another user's: not admitted.
    let last = &tickets[&8];
    let forged = format!("{}x", last);
    for (token, ticket) in [
        (&tokens[&8], None),
        (&tokens[&8], Some(last.as_str())),
        (&tokens[&8], Some(forged.as_str())),
        (&tokens[&7], Some(last.as_str())),
    ] {
        let (status, body) = buy_with(&app, voucher, token, ticket).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::FORBIDDEN, Some("not_admitted"))
        );
    }
    // Each user polls until admitted, then buys with the admitted ticket.
    let mut admitted_at = Vec::new();
    for user in 1..=8 {
        let deadline = Instant::now() + Duration::from_secs(30);
        let ticket = loop {
            let (status, body) = poll(&app, voucher, &tokens[&user], &tickets[&user]).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let serving = body["serving"].as_i64().unwrap();
            // Never ahead of the pace (one place of slack for rounding).
            let allowed = began.elapsed().as_secs_f64() * rate as f64 + 1.0;
            assert!(
                serving as f64 <= allowed,
                "serving {serving} after {:?}",
                began.elapsed()
            );
            if body["status"] == "admitted" {
                assert!(body["admitted_until"].is_string(), "{body}");
                break ticket(&body).to_owned();
            }
            assert_eq!(body["status"], "waiting", "{body}");
            assert!(
                Instant::now() < deadline,
                "user {user} never admitted: {body}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        admitted_at.push(began.elapsed());
        let (status, body) = buy_with(&app, voucher, &tokens[&user], Some(&ticket)).await;
        assert_eq!(status, StatusCode::OK, "user {user}: {body}");
    }
    // Eight places at two a second: the last one not before ~3.5 s.
    assert!(
        admitted_at[7] >= Duration::from_millis(3_000),
        "admitted too fast: {admitted_at:?}"
    );
    assert_eq!(app.check_invariants(voucher).await, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_room_says_so_at_the_next_poll() {
    let app = spawn_app().await;
    let voucher = room_voucher(&app, 1, 100, chrono::Duration::seconds(-1)).await;
    let tokens = app.tokens([1, 2]).await;
    let (_, first) = join(&app, voucher, &tokens[&1]).await;
    let (_, second) = join(&app, voucher, &tokens[&2]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, admitted) = poll(&app, voucher, &tokens[&1], ticket(&first)).await;
    assert_eq!(admitted["status"], "admitted", "{admitted}");
    assert_eq!(
        buy_with(&app, voucher, &tokens[&1], Some(ticket(&admitted)))
            .await
            .0,
        StatusCode::OK
    );
    let started = Instant::now();
    loop {
        let (status, body) = poll(&app, voucher, &tokens[&2], ticket(&second)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if body["status"] == "sold_out" {
            break;
        }
        // The sold-out flag is set by the purchase that could not buy, or
        // read within its trust: a purchase attempt makes it so.
        let _ = buy_with(&app, voucher, &tokens[&2], body["ticket"].as_str()).await;
        assert!(started.elapsed() < Duration::from_secs(10), "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.check_invariants(voucher).await;
}

#[tokio::test]
async fn a_room_that_asks_for_proof_of_work_admits_only_solved_joins() {
    let app = spawn_app().await;
    let begin = Utc::now() - chrono::Duration::seconds(1);
    let bits = 8;
    let voucher = app
        .create_voucher_from(json!({
            "title": "room", "stock": 5,
            "begin_time": begin, "end_time": begin + chrono::Duration::hours(1),
            "waiting_room": { "admit_per_second": 10, "proof_of_work_bits": bits },
        }))
        .await;
    let token = app.token(4).await;
    let url = app.url(&format!("/vouchers/{voucher}/queue"));
    let join_with = |proof: Option<String>| {
        let mut request = app.client.post(&url).bearer_auth(&token);
        if let Some(proof) = proof {
            request = request.header("x-queue-proof", proof);
        }
        answer(request)
    };
    let (status, body) = join_with(None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("seckill-queue:"),
        "{body}"
    );
    // What to solve, for a client to read rather than parse the message.
    assert_eq!(
        (body["challenge"].as_str(), body["proof_bits"].as_u64()),
        (
            Some(format!("seckill-queue:{voucher}:4:").as_str()),
            Some(bits.into())
        ),
        "{body}"
    );
    let proof_holds = |voucher, user, nonce: &str| {
        let (voucher, user) = (VoucherId::new(voucher).unwrap(), UserId::new(user).unwrap());
        seckill::seckill::proof_holds(voucher, user, nonce, bits)
    };
    let solved = (0u64..)
        .map(|n| n.to_string())
        .find(|n| proof_holds(voucher, 4, n))
        .unwrap();
    // Another user's solution is not this user's.
    let wrong = (0u64..)
        .map(|n| n.to_string())
        .find(|n| proof_holds(voucher, 5, n) && !proof_holds(voucher, 4, n))
        .unwrap();
    assert_eq!(join_with(Some(wrong)).await.0, StatusCode::BAD_REQUEST);
    let (status, body) = join_with(Some(solved)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["place"], 1, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_that_redis_lost_lets_admitted_tickets_buy_and_places_returning_buyers_anew() {
    let (mut redis, app) = crate::helpers::spawn_app_on_own_redis(None).await;
    let voucher = room_voucher(&app, 10, 2, chrono::Duration::seconds(-1)).await;
    let tokens = app.tokens(1..=4).await;
    let mut tickets = HashMap::new();
    for user in 1..=4 {
        let (status, body) = join(&app, voucher, &tokens[&user]).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        tickets.insert(user, ticket(&body).to_owned());
    }
    let admitted = |user: i64, ticket: String| {
        let app = &app;
        let token = tokens[&user].clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut ticket = ticket;
            loop {
                let (status, body) = poll(app, voucher, &token, &ticket).await;
                assert_eq!(status, StatusCode::OK, "user {user}: {body}");
                ticket = self::ticket(&body).to_owned();
                if body["status"] == "admitted" {
                    return ticket;
                }
                assert!(
                    Instant::now() < deadline,
                    "user {user} never admitted: {body}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let first = admitted(1, tickets[&1].clone()).await;

    // Redis comes back empty: the room's lists, counter and admissions are
    // gone.
    redis.stop();
    redis.restart();
    app.wait_ready().await;
    // An admitted ticket is checked without Redis: it still buys.
    let (status, body) = buy_with(&app, voucher, &tokens[&1], Some(&first)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // A waiting buyer who joins again is placed anew, admitted at the
    // room's pace, and buys.
    let (status, body) = join(&app, voucher, &tokens[&3]).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let again = admitted(3, ticket(&body).to_owned()).await;
    let (status, body) = buy_with(&app, voucher, &tokens[&3], Some(&again)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // A waiting buyer who only polls, with the ticket of a place the room
    // no longer has, is placed anew too, admitted and buys.
    let polled = admitted(4, tickets[&4].clone()).await;
    let (status, body) = buy_with(&app, voucher, &tokens[&4], Some(&polled)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Without an admission, still nothing.
    let (status, body) = buy_with(&app, voucher, &tokens[&2], None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("not_admitted")),
        "{body}"
    );
    assert_eq!(app.check_invariants(voucher).await, 3);
}

/// A room of a test's own in the shared Redis (its four keys: room,
/// pre-queue, later joiners, admissions), driven by `lua/room_join.lua`
/// itself; [`ScriptRoom::delete`] removes it.
struct ScriptRoom {
    redis: redis::aio::MultiplexedConnection,
    keys: Vec<String>,
    script: redis::Script,
}

impl ScriptRoom {
    async fn new() -> Self {
        let redis = crate::helpers::redis_conn(&crate::helpers::redis_url()).await;
        let prefix = format!("test:{}:room:{{1}}:", uuid::Uuid::new_v4().simple());
        let keys = ["room", "early", "late", "admitted"]
            .iter()
            .map(|k| format!("{prefix}{k}"))
            .collect();
        let script = redis::Script::new(include_str!("../../lua/room_join.lua"));
        Self {
            redis,
            keys,
            script,
        }
    }

    /// The room as if it had begun: `serving` served, its counter last
    /// moved at `last_ms`, `late` later joiners placed.
    async fn begun(&mut self, serving: i64, last_ms: i64, late: i64) {
        let _: () = redis::cmd("HSET")
            .arg(&self.keys[0])
            .arg(&[("serving", serving), ("last_ms", last_ms), ("late", late)])
            .query_async(&mut self.redis)
            .await
            .unwrap();
    }

    /// One call of the script for `user` ("": only move the counter on) in
    /// a room that began long ago, at `rate` a second, with an admission
    /// window of `window_ms`: `[place, serving, admitted_ms, now_ms,
    /// placed, sold_out]`.
    async fn ask(&mut self, user: &str, rate: i64, sold_out: u8, window_ms: i64) -> Vec<i64> {
        let mut invocation = self.script.prepare_invoke();
        for key in &self.keys {
            invocation.key(key);
        }
        // user, draw, begin, rate, sold out, life, window
        invocation
            .arg(user)
            .arg(0)
            .arg(0)
            .arg(rate)
            .arg(sold_out)
            .arg(60)
            .arg(window_ms);
        invocation.invoke_async(&mut self.redis).await.unwrap()
    }

    /// Redis's clock in milliseconds, as the script reads it.
    async fn redis_ms(&mut self) -> i64 {
        let (seconds, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut self.redis)
            .await
            .unwrap();
        seconds * 1000 + micros / 1000
    }

    async fn delete(mut self) {
        let _: () = redis::cmd("DEL")
            .arg(&self.keys)
            .query_async(&mut self.redis)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_room_above_a_thousand_a_second_admits_at_its_rate_however_often_it_is_asked() {
    // The room's script itself, asked a thousand times back to back (one
    // pipeline: most calls within the same millisecond), at 1500 a second,
    // with a hundred thousand places handed out: it may admit what 1500 a
    // second allows in the time Redis's clock says passed, no more.
    let mut room = ScriptRoom::new().await;
    // Loaded first, so that the pipeline's EVALSHAs find it.
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(include_str!("../../lua/room_join.lua"))
        .query_async(&mut room.redis)
        .await
        .unwrap();
    let started = room.redis_ms().await - 1;
    room.begun(0, started, 100_000).await;
    let mut pipeline = redis::pipe();
    for _ in 0..1000 {
        pipeline
            .cmd("EVALSHA")
            .arg(&sha)
            .arg(room.keys.len())
            .arg(&room.keys)
            .arg("")
            .arg(0)
            .arg(0)
            .arg(1500)
            .arg(0)
            .arg(60)
            .arg(60_000)
            .ignore();
    }
    let _: () = pipeline.query_async(&mut room.redis).await.unwrap();
    let elapsed = room.redis_ms().await - started;
    let serving: i64 = redis::cmd("HGET")
        .arg(&room.keys[0])
        .arg("serving")
        .query_async(&mut room.redis)
        .await
        .unwrap();
    room.delete().await;
    let allowed = (elapsed + 1) * 1500 / 1000 + 1;
    assert!(
        serving <= allowed,
        "{serving} admitted in {elapsed} ms at 1500/s (at most {allowed})"
    );
    assert!(serving > 0, "the room admitted nobody in {elapsed} ms");
}

#[tokio::test]
async fn a_room_asked_every_millisecond_admits_exactly_its_pace() {
    // The room's script itself at 999 a second (1000 does not divide it),
    // asked again about every millisecond: each call must keep the part of
    // an admission its time earned, so that the counter, read by the last
    // call, is what 999 a second allows since the room began, exactly,
    // whatever the calls' spacing (500 a second before: each step's time
    // was rounded up to a whole millisecond).
    let mut room = ScriptRoom::new().await;
    let started = room.redis_ms().await - 1;
    room.begun(0, started, 100_000).await;
    let mut last = Vec::new();
    for _ in 0..200 {
        last = room.ask("", 999, 0, 60_000).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    room.delete().await;
    let (serving, now) = (last[1], last[3]);
    assert_eq!(
        serving,
        (now - started) * 999 / 1000,
        "{serving} admitted in {} ms at 999/s",
        now - started
    );
}

#[tokio::test]
async fn a_place_reached_while_sold_out_starts_its_window_only_once_it_can_buy() {
    // The room's script itself: place 3 of 10, all of them served, asked
    // first while the voucher is sold out (its window would run out before
    // a cancel's unit came back), then once units are back.
    let mut room = ScriptRoom::new().await;
    room.begun(10, 0, 10).await;
    let _: () = redis::cmd("HSET")
        .arg(&room.keys[2])
        .arg("7")
        .arg(3)
        .query_async(&mut room.redis)
        .await
        .unwrap();
    let sold_out = room.ask("7", 1000, 1, 60_000).await;
    assert_eq!(
        (sold_out[0], sold_out[2], sold_out[5]),
        (3, 0, 1),
        "{sold_out:?}"
    );
    let back = room.ask("7", 1000, 0, 60_000).await;
    room.delete().await;
    assert_eq!((back[0], back[5]), (3, 0), "{back:?}");
    assert_eq!(
        back[2], back[3],
        "admitted when it could first buy: {back:?}"
    );
}

#[tokio::test]
async fn a_room_whose_sale_ended_takes_no_one() {
    let app = spawn_app().await;
    let voucher = room_voucher(&app, 5, 100, chrono::Duration::seconds(-3601)).await;
    let tokens = app.tokens([1]).await;
    let (status, body) = join(&app, voucher, &tokens[&1]).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("ended")),
        "{body}"
    );
}

#[tokio::test]
async fn an_admission_past_its_window_is_over_and_its_user_waits_again_at_the_back() {
    // The room's script itself, with a window of 50 ms (the service's is
    // ADMISSION_WINDOW, a minute), at 1000 admissions a second.
    let mut room = ScriptRoom::new().await;
    let joined = room.ask("7", 1000, 0, 50).await;
    assert_eq!((joined[0], joined[2]), (1, 0), "{joined:?}");
    tokio::time::sleep(Duration::from_millis(5)).await;
    let first = room.ask("7", 1000, 0, 50).await;
    assert_eq!(first[0], 1, "{first:?}");
    assert!(first[2] > 0, "admitted once its place is served: {first:?}");
    // Within the window, the same admission.
    assert_eq!(room.ask("7", 1000, 0, 50).await[2], first[2]);
    tokio::time::sleep(Duration::from_millis(60)).await;
    let over = room.ask("7", 1000, 0, 50).await;
    assert_eq!(
        (over[0], over[2], over[4]),
        (2, 0, 2),
        "past its window: placed again at the back, waiting: {over:?}"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    let again = room.ask("7", 1000, 0, 50).await;
    room.delete().await;
    assert_eq!(again[0], 2, "{again:?}");
    assert!(
        again[2] > first[2] + 50,
        "admitted anew once the new place is served: {again:?} after {first:?}"
    );
}
