//! Sign-in with the shop's JWTs: keys made here (RS256 by openssl, ES256
//! and EdDSA by ring, an HS256 secret), a JWK Set from a file and one
//! served over HTTP (rotated, failing, flooded with unknown `kid`s), and
//! every refusal.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use reqwest::StatusCode;
use serde_json::{json, Value};
use testkit::jwt::{jwk_set, JwtKey};

use crate::helpers::{answer, assert_refused_to_start, buy, poll_until, spawn_app_with, TestApp};

const ISSUER: &str = "https://id.shop.test/";
const AUDIENCE: &str = "seckill";
const HS256_SECRET: &str = "test-jwt-hs256-secret-5a9c1e7b3d0f2a8c6e4b";

/// A key pair made for one test: how to sign with it, and its public JWK.
type TestKey = JwtKey;

/// A 2048-bit RSA key pair from openssl.
fn rsa_key(kid: &'static str) -> TestKey {
    JwtKey::rsa(kid, &tempdir()).expect("openssl makes an RSA key")
}

fn es256_key(kid: &'static str) -> TestKey {
    JwtKey::es256(kid).expect("ring makes a P-256 key")
}

fn eddsa_key(kid: &'static str) -> TestKey {
    JwtKey::eddsa(kid).expect("ring makes an Ed25519 key")
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("seckill-jwt-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Claims for `sub` as the shop issues them, valid for an hour.
fn claims(sub: &str) -> Value {
    json!({ "iss": ISSUER, "aud": [AUDIENCE, "other-api"], "sub": sub, "iat": now(), "exp": now() + 3600 })
}

/// A test's token, signed with its key.
trait Sign {
    fn sign(&self, claims: &Value) -> String;
}

impl Sign for TestKey {
    fn sign(&self, claims: &Value) -> String {
        self.token(claims).expect("the key signs")
    }
}

fn hs256(claims: &Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(HS256_SECRET.as_bytes()),
    )
    .unwrap()
}

/// An app that takes JWTs of the test issuer: the HS256 secret, and the
/// JWK Set at `jwks` when given (a path or a URL).
async fn jwt_app(jwks: Option<String>) -> TestApp {
    spawn_app_with(move |mut s| {
        s.jwt_hs256_secret = Some(HS256_SECRET.to_owned().into());
        s.jwt_issuer = Some(ISSUER.into());
        s.jwt_audience = Some(AUDIENCE.into());
        s.jwt_jwks = jwks;
        s
    })
    .await
}

/// `POST /seckill/{voucher}` with `token`: the status and the body.
async fn purchase(app: &TestApp, voucher: i64, token: &str) -> (StatusCode, Value) {
    app.post_as(&format!("/seckill/{voucher}"), token).await
}

/// A token for `sub` signed with `key` under the kid `kid` (a made-up one,
/// or another key's).
fn under_kid(key: &TestKey, kid: &str, sub: &str) -> String {
    let mut header = Header::new(key.algorithm);
    header.kid = Some(kid.to_owned());
    encode(&header, &claims(sub), &key.signing).unwrap()
}

/// A purchase with `token` under way: its status, once answered.
fn buying(app: &TestApp, voucher: i64, token: String) -> tokio::task::JoinHandle<StatusCode> {
    let (client, url) = (app.client.clone(), app.url(&format!("/seckill/{voucher}")));
    tokio::spawn(async move {
        let answer = client.post(url).bearer_auth(token).send().await.unwrap();
        answer.status()
    })
}

#[tokio::test]
async fn a_jwt_signs_a_buyer_in_whose_sub_is_their_user_or_maps_to_a_stable_one() {
    let app = jwt_app(None).await;
    let voucher = app.open_voucher(10).await;

    // A numeric sub is the user id; the order shows the sub it was bought
    // under, from its first read.
    let (status, body) = purchase(&app, voucher, &hs256(&claims("42"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let order = body["order_id"].as_str().unwrap().to_owned();
    let (_, shown) = app
        .get_as(&format!("/orders/{order}"), &hs256(&claims("42")))
        .await;
    assert_eq!(
        (&shown["user_id"], &shown["user_ref"]),
        (&json!(42), &json!("42"))
    );
    // The same user by the service's own token: the same order.
    let (status, body) = purchase(&app, voucher, &app.token(42).await).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_purchased"))
    );
    assert_eq!(body["order_id"].as_str(), Some(order.as_str()));

    // Other subs get ids of their own, above every numeric one, the same on
    // another instance.
    let other = app.spawn_instance().await;
    let mut ids = Vec::new();
    for sub in [
        "auth0|5f7c8ec7c33c6c004bbafe82",
        "0b6c3b4e-6f9a-4c1d-9a51-1f0e2d3c4b5a",
        "042",
    ] {
        let token = hs256(&claims(sub));
        let (status, body) = purchase(&app, voucher, &token).await;
        assert_eq!(status, StatusCode::OK, "{sub}: {body}");
        let order = body["order_id"].as_str().unwrap();
        let (status, there) = answer(
            app.client
                .get(format!("{other}/orders/{order}"))
                .bearer_auth(&token),
        )
        .await;
        assert_eq!(
            status,
            StatusCode::OK,
            "the other instance knows {sub} as the same user"
        );
        assert_eq!(there["user_ref"], sub);
        let id = there["user_id"].as_i64().unwrap();
        assert!(id > (1 << 53) - 1, "{sub} mapped to {id}");
        ids.push(id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 3, "three subs, three users: {ids:?}");
    // An exp past any date stands for "never": it signs in, the second
    // time too (from the verified tokens), and the sum with the leeway
    // overflows nowhere.
    let forever = hs256(&json!({ "iss": ISSUER, "aud": AUDIENCE, "sub": "77", "exp": u64::MAX }));
    let (status, body) = purchase(&app, voucher, &forever).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = purchase(&app, voucher, &forever).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_purchased")),
        "{body}"
    );
    // A v1 token's order shows no sub.
    let (_, body) = purchase(&app, voucher, &app.token(7).await).await;
    let (_, order) = app
        .admin_get(&format!("/orders/{}", body["order_id"].as_str().unwrap()))
        .await;
    assert_eq!(order["user_ref"], Value::Null);
}

#[tokio::test]
async fn an_async_orders_sub_shows_while_it_is_pending_too() {
    let app = jwt_app(None).await;
    let voucher = app.open_async_voucher(10).await;
    // The writers wait behind a lock on the orders table: the orders stay
    // pending (reads still pass).
    let mut hold = app.db.begin().await.unwrap();
    sqlx::query("LOCK TABLE voucher_orders IN EXCLUSIVE MODE")
        .execute(&mut *hold)
        .await
        .unwrap();
    for sub in ["43", "auth0|pending"] {
        let token = hs256(&claims(sub));
        let (status, body) = purchase(&app, voucher, &token).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{sub}: {body}");
        let order = body["order_id"].as_str().unwrap();
        let (_, shown) = app.get_as(&format!("/orders/{order}"), &token).await;
        // Before: null until the order was stored.
        assert_eq!(
            (&shown["status"], &shown["user_ref"]),
            (&json!("pending"), &json!(sub)),
            "{shown}"
        );
    }
    hold.rollback().await.unwrap();
}

#[tokio::test]
async fn every_key_type_verifies_and_every_bad_token_is_401_saying_why_and_nothing_of_the_keys_needs_openssl(
) {
    let (rsa, ec, ed) = (rsa_key("r1"), es256_key("e1"), eddsa_key("d1"));
    let dir = tempdir();
    let path = dir.join("jwks.json");
    std::fs::write(&path, jwk_set(&[&rsa, &ec, &ed])).unwrap();
    let app = jwt_app(Some(path.display().to_string())).await;
    let voucher = app.open_voucher(100).await;

    for (user, key) in [(1, &rsa), (2, &ec), (3, &ed)] {
        let (status, body) = purchase(&app, voucher, &key.sign(&claims(&user.to_string()))).await;
        assert_eq!(status, StatusCode::OK, "{:?}: {body}", key.algorithm);
    }
    // Within the 30 s leeway.
    let late = json!({ "iss": ISSUER, "aud": AUDIENCE, "sub": "4", "exp": now() - 10 });
    assert_eq!(
        purchase(&app, voucher, &rsa.sign(&late)).await.0,
        StatusCode::OK
    );

    let with = |changes: Value| {
        let mut c = claims("5");
        c.as_object_mut()
            .unwrap()
            .extend(changes.as_object().unwrap().clone());
        c
    };
    let mut without_exp = claims("5");
    without_exp.as_object_mut().unwrap().remove("exp");
    let valid = rsa.sign(&claims("5"));
    let (head, rest) = valid.split_once('.').unwrap();
    let (body, signature) = rest.split_once('.').unwrap();
    let forged_claims = b64(with(json!({ "sub": "6" })).to_string().as_bytes());
    let none_header = b64(br#"{"alg":"none","typ":"JWT"}"#);
    // HS256 "signed" with the RSA key's public modulus as the secret: the
    // classic confusion of algorithms.
    let confused = encode(
        &Header::new(Algorithm::HS256),
        &claims("5"),
        &EncodingKey::from_secret(rsa.jwk["n"].as_str().unwrap().as_bytes()),
    )
    .unwrap();
    let mut es_header_on_rsa = Header::new(Algorithm::ES256);
    es_header_on_rsa.kid = Some("r1".into());
    let ec_claiming_rsa = encode(&es_header_on_rsa, &claims("5"), &ec.signing).unwrap();
    let mut unknown = Header::new(Algorithm::RS256);
    unknown.kid = Some("nobody".into());
    let unknown_kid = encode(&unknown, &claims("5"), &rsa.signing).unwrap();
    let no_kid = encode(&Header::new(Algorithm::RS256), &claims("5"), &rsa.signing).unwrap();
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "expired",
            rsa.sign(&with(json!({ "exp": now() - 100 }))),
            "expired",
        ),
        (
            "not yet valid",
            rsa.sign(&with(json!({ "nbf": now() + 100 }))),
            "not valid yet",
        ),
        (
            "another audience",
            rsa.sign(&with(json!({ "aud": "other-api" }))),
            "audience",
        ),
        (
            "no audience",
            rsa.sign(&with(json!({ "aud": null }))),
            "aud",
        ),
        (
            "another issuer",
            rsa.sign(&with(json!({ "iss": "https://evil.test/" }))),
            "issuer",
        ),
        (
            "an issuer list that holds the issuer",
            rsa.sign(&with(json!({ "iss": [ISSUER, "https://evil.test/"] }))),
            "issuer",
        ),
        (
            "an nbf that is text",
            rsa.sign(&with(json!({ "nbf": "4102444800" }))),
            "nbf",
        ),
        (
            "a negative nbf",
            rsa.sign(&with(json!({ "nbf": -1 }))),
            "nbf",
        ),
        (
            "a NUL in the sub",
            rsa.sign(&with(json!({ "sub": "a\u{0}b" }))),
            "NUL",
        ),
        (
            "a token over 8 KiB",
            rsa.sign(&with(json!({ "pad": "x".repeat(9_000) }))),
            "8 KiB",
        ),
        ("no exp", rsa.sign(&without_exp), "exp"),
        ("no sub", rsa.sign(&with(json!({ "sub": null }))), "sub"),
        (
            "a sub too long",
            rsa.sign(&with(json!({ "sub": "x".repeat(256) }))),
            "sub",
        ),
        (
            "edited claims",
            format!("{head}.{forged_claims}.{signature}"),
            "signature",
        ),
        ("alg none", format!("{none_header}.{body}."), "token"),
        ("HS256 with the public key", confused, "signature"),
        ("ES256 naming an RSA key", ec_claiming_rsa, "algorithm"),
        ("an unknown kid", unknown_kid, "no key with kid"),
        ("no kid among three keys", no_kid, "kid"),
        ("not a token", "eyJ.eyJ.x".into(), "malformed"),
    ];
    let secret_parts = [rsa.jwk["n"].as_str().unwrap(), HS256_SECRET];
    for (case, token, why) in cases {
        let (status, body) = purchase(&app, voucher, &token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{case}: {body}");
        assert_eq!(body["error"], "unauthorized", "{case}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains(why),
            "{case}: {message:?} does not say {why:?}"
        );
        assert!(
            secret_parts.iter().all(|s| !message.contains(&s[..20])),
            "{case} leaks a key: {message}"
        );
    }
    let (_, stats) = app
        .admin_get(&format!("/admin/vouchers/{voucher}/stats"))
        .await;
    assert_eq!(
        stats["orders"], 4,
        "no refused token bought anything: {stats}"
    );
}

/// A JWK Set served over HTTP: what it serves (or `None`: a 500), after
/// how long, and how many times it was fetched and answered.
#[derive(Clone, Default)]
struct JwksServer {
    set: Arc<Mutex<Option<String>>>,
    delay: Arc<Mutex<Duration>>,
    fetches: Arc<Mutex<usize>>,
    answered: Arc<Mutex<usize>>,
}

impl JwksServer {
    async fn start() -> (Self, String) {
        let server = Self::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/.well-known/jwks.json",
            listener.local_addr().unwrap()
        );
        let state = server.clone();
        let router = axum::Router::new().route(
            "/.well-known/jwks.json",
            axum::routing::get(move || {
                let state = state.clone();
                async move {
                    *state.fetches.lock().unwrap() += 1;
                    let delay = *state.delay.lock().unwrap();
                    tokio::time::sleep(delay).await;
                    let set = state.set.lock().unwrap().clone();
                    *state.answered.lock().unwrap() += 1;
                    match set {
                        Some(set) => (axum::http::StatusCode::OK, set),
                        None => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, String::new()),
                    }
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, router).await });
        (server, url)
    }

    fn serve(&self, set: Option<String>) {
        *self.set.lock().unwrap() = set;
    }

    fn fetches(&self) -> usize {
        *self.fetches.lock().unwrap()
    }

    fn answered(&self) -> usize {
        *self.answered.lock().unwrap()
    }
}

/// An app whose JWK Set, served by a server of the test's, holds `key`;
/// ready (the set loaded), with a voucher of 10 on sale.
async fn ready_on_jwks_server(key: &TestKey) -> (JwksServer, TestApp, i64) {
    let (server, url) = JwksServer::start().await;
    server.serve(Some(jwk_set(&[key])));
    let app = jwt_app(Some(url)).await;
    app.wait_ready().await;
    let voucher = app.open_voucher(10).await;
    (server, app, voucher)
}

#[tokio::test]
async fn a_body_sent_whole_is_read_though_its_token_waited_for_the_jwk_set_past_the_body_deadline()
{
    let (a, b) = (es256_key("a"), es256_key("b"));
    let (server, url) = JwksServer::start().await;
    server.serve(Some(jwk_set(&[&a])));
    let app = spawn_app_with(move |mut s| {
        s.jwt_issuer = Some(ISSUER.into());
        s.jwt_audience = Some(AUDIENCE.into());
        s.jwt_jwks = Some(url);
        s.body_timeout = Duration::from_secs(1);
        s
    })
    .await;
    app.wait_ready().await;
    let voucher = app.open_voucher(10).await;
    // b is new and the identity provider slow: b's token waits for the
    // next fetch allowed and for its answer, past the body's deadline,
    // though its body arrived with its headers.
    server.serve(Some(jwk_set(&[&a, &b])));
    *server.delay.lock().unwrap() = Duration::from_millis(1_200);
    let (status, body) = answer(
        app.client
            .post(app.url(&format!("/seckill/{voucher}")))
            .bearer_auth(b.sign(&claims("1")))
            .json(&json!({ "quantity": 1 })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // A client that asks `Expect: 100-continue` sends its body only once
    // the handler asks for it, after the deadline has passed: it is given
    // a moment from then.
    let c = es256_key("c");
    server.serve(Some(jwk_set(&[&a, &b, &c])));
    let mut stream = tokio::net::TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .unwrap();
    let body = r#"{"quantity": 1}"#;
    let head = format!(
        "POST /seckill/{voucher} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\
         Connection: close\r\n\r\n",
        c.sign(&claims("2")),
        body.len()
    );
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut interim = [0_u8; 25];
    stream.read_exact(&mut interim).await.unwrap();
    assert!(interim.starts_with(b"HTTP/1.1 100 Continue"), "{interim:?}");
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_for_a_new_kid_completes_though_the_request_that_started_it_gave_up() {
    let (a, b) = (es256_key("a"), es256_key("b"));
    let (server, app, voucher) = ready_on_jwks_server(&a).await;
    // b is published, and the identity provider is slow. Once the start's
    // fetch is 5 s old, a token of b starts a fetch; its client hangs up
    // long before the answer.
    server.serve(Some(jwk_set(&[&a, &b])));
    *server.delay.lock().unwrap() = Duration::from_millis(1_500);
    tokio::time::sleep(Duration::from_millis(5_200)).await;
    let before = server.fetches();
    let gave_up = app
        .impatient_purchase(voucher, &b.sign(&claims("1")), Duration::from_millis(200))
        .await;
    assert!(gave_up.is_err(), "the request waited for the fetch");
    assert_eq!(server.fetches(), before + 1, "the token started a fetch");
    // The fetch ran to its end: b is known within the 5 s in which no other
    // fetch may start. (Cut off with its request, it would have left b
    // unknown, and every token of b refused, until the next fetch.)
    poll_until(
        Duration::from_secs(5),
        Duration::from_millis(50),
        "the fetch answered",
        || async { server.answered() },
        |n| *n > before,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, body) = purchase(&app, voucher, &b.sign(&claims("2"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(server.fetches(), before + 1, "no second fetch was needed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_published_while_a_fetch_runs_is_found_and_tokens_past_the_waiting_bound_are_not_held(
) {
    let (a, b) = (es256_key("a"), es256_key("b"));
    let (server, app, voucher) = ready_on_jwks_server(&a).await;
    let made_up = |i: usize| under_kid(&a, &format!("made-up-{i}"), "3");
    let buying = |token: String| buying(&app, voucher, token);
    // A made-up kid starts a fetch of the set as it is (a alone), which the
    // identity provider answers in 2 s...
    *server.delay.lock().unwrap() = Duration::from_millis(2_000);
    tokio::time::sleep(Duration::from_millis(5_200)).await;
    let (fetched, answered) = (server.fetches(), server.answered());
    let first = buying(made_up(0));
    poll_until(
        Duration::from_secs(5),
        Duration::from_millis(10),
        "a fetch for the made-up kid",
        || async { server.fetches() },
        |n| *n > fetched,
    )
    .await;
    // ...while it runs, b is published and b's token comes: the running
    // fetch began before b, so b's token waits for the next one (refused as
    // unknown before, answered by the fetch that missed b).
    server.serve(Some(jwk_set(&[&a, &b])));
    let b_buys = buying(b.sign(&claims("2")));
    // Made-up kids past the tokens that may wait (64) are refused at once,
    // not held until the running fetch ends (they waited for it before).
    let mut flood: Vec<_> = (1..=80).map(|i| buying(made_up(i))).collect();
    let refused_at_once = poll_until(
        Duration::from_secs(10),
        Duration::from_millis(10),
        "made-up kids past the bound refused, or the fetch answered",
        || async {
            let done = flood.iter().filter(|t| t.is_finished()).count();
            (done, server.answered())
        },
        |(done, now_answered)| *done >= 10 || *now_answered > answered,
    )
    .await;
    assert!(
        refused_at_once.1 == answered,
        "no made-up kid was answered before the running fetch ended: {refused_at_once:?}"
    );
    for task in flood.drain(..) {
        assert_eq!(task.await.unwrap(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(first.await.unwrap(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        b_buys.await.unwrap(),
        StatusCode::OK,
        "b's token, published during a fetch"
    );
}

#[tokio::test]
async fn a_jwk_set_by_url_gates_readiness_rotates_and_is_fetched_at_most_once_per_5_s() {
    let (a, b) = (es256_key("a"), es256_key("b"));
    let (server, url) = JwksServer::start().await;
    let app = jwt_app(Some(url)).await;
    let voucher = app.open_voucher(100).await;
    // The identity provider fails: not ready, JWT buyers 503, v1 buyers fine.
    poll_until(
        Duration::from_secs(5),
        Duration::from_millis(50),
        "a first fetch",
        || async { server.fetches() },
        |n| *n >= 1,
    )
    .await;
    let (status, _) = answer(app.client.get(app.url("/readyz"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, body) = purchase(&app, voucher, &a.sign(&claims("1"))).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable")),
        "{body}"
    );
    assert!(buy(&app.client, &app.base, &app.token(2).await, voucher)
        .await
        .1
        .starts_with("ok"));

    server.serve(Some(jwk_set(&[&a])));
    app.wait_ready().await;
    assert_eq!(
        purchase(&app, voucher, &a.sign(&claims("1"))).await.0,
        StatusCode::OK
    );

    // A flood of made-up kids: every one 401, the set fetched at most once
    // more (the 5 s bound).
    let before = server.fetches();
    let flood: Vec<_> = (0..200)
        .map(|i| buying(&app, voucher, under_kid(&a, &format!("made-up-{i}"), "3")))
        .collect();
    for status in flood {
        assert_eq!(status.await.unwrap(), StatusCode::UNAUTHORIZED);
    }
    assert!(
        server.fetches() - before <= 1,
        "{} fetches for one flood",
        server.fetches() - before
    );

    // Rotation without a restart: b appears, then a is withdrawn. The set
    // was fetched a moment ago (for the flood): b's first token waits for
    // the next fetch allowed and is accepted, never refused as unknown.
    server.serve(Some(jwk_set(&[&a, &b])));
    let started = std::time::Instant::now();
    let before = server.fetches();
    let (status, body) = purchase(&app, voucher, &b.sign(&claims("4"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let fetched = server.fetches() - before;
    let bound = 1 + started.elapsed().as_secs() as usize / 5;
    assert!(
        fetched <= bound,
        "{fetched} fetches in {:?}",
        started.elapsed()
    );
    let a_token = a.sign(&claims("5"));
    assert_eq!(purchase(&app, voucher, &a_token).await.0, StatusCode::OK);
    server.serve(Some(jwk_set(&[&b])));
    // An unknown kid makes the next fetch (once 5 s have passed): a's
    // token, verified before, is verified again and refused.
    let unknown = under_kid(&b, "c", "6");
    poll_until(
        Duration::from_secs(15),
        Duration::from_millis(500),
        "the withdrawn key's token refused",
        || async {
            purchase(&app, voucher, &unknown).await;
            app.get_as("/orders/1", &a_token).await.0
        },
        |s| *s == StatusCode::UNAUTHORIZED,
    )
    .await;
}

#[tokio::test]
async fn a_jwt_key_without_its_issuer_and_audience_or_a_weak_secret_stops_the_start() {
    let base = crate::helpers::settings("postgres://unused", "redis://unused", "x:");
    let mut no_issuer = base.clone();
    no_issuer.jwt_hs256_secret = Some(HS256_SECRET.to_owned().into());
    no_issuer.jwt_audience = Some(AUDIENCE.into());
    assert_refused_to_start(no_issuer, "SECKILL_JWT_ISSUER").await;
    let mut no_audience = base.clone();
    no_audience.jwt_jwks = Some("/nowhere/jwks.json".into());
    no_audience.jwt_issuer = Some(ISSUER.into());
    assert_refused_to_start(no_audience, "SECKILL_JWT_AUDIENCE").await;
    let mut weak = base;
    weak.jwt_hs256_secret = Some("short".to_owned().into());
    weak.jwt_issuer = Some(ISSUER.into());
    weak.jwt_audience = Some(AUDIENCE.into());
    assert_refused_to_start(weak, "SECKILL_JWT_HS256_SECRET").await;
}
