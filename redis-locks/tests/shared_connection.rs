//! The shared connection against the local Redis (`REDIS_URL`, by default
//! `redis://127.0.0.1:6379`): calls that give up at their deadline never
//! hand their late answers to anyone else.

use std::time::Duration;

use redis_locks::SharedConnection;
use tokio::task::JoinSet;

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_timed_out_never_hands_its_late_answer_to_another() {
    let client = redis::Client::open(redis_url()).unwrap();
    let shared = std::sync::Arc::new(SharedConnection::new(client, Duration::from_secs(5)));
    let empty = format!("redis-locks-test:{}:empty", uuid::Uuid::new_v4().simple());
    let mut calls = JoinSet::new();
    for i in 0..400u32 {
        let (shared, empty) = (shared.clone(), empty.clone());
        calls.spawn(async move {
            if i % 10 == 0 {
                // Blocks the connection for 30 ms; its caller gives up after
                // 5: its answer (nil) comes later, while others wait.
                let slow = redis::cmd("BLPOP").arg(&empty).arg(0.03).clone();
                let answer = shared
                    .query_within::<Option<(String, String)>>(Duration::from_millis(5), &slow)
                    .await;
                match answer {
                    Err(error) => {
                        assert!(error.is_timeout(), "{error}");
                        (0, 1)
                    }
                    Ok(None) => (0, 0),
                    Ok(Some(popped)) => panic!("nothing was pushed, yet popped {popped:?}"),
                }
            } else {
                // Each answer must be this call's own.
                let mine = format!("call-{i}");
                let echoed: String = shared
                    .query(redis::cmd("ECHO").arg(&mine))
                    .await
                    .expect("a call with a long deadline is answered");
                assert_eq!(echoed, mine);
                (1, 0)
            }
        });
    }
    let (mut answered, mut gave_up) = (0, 0);
    while let Some(outcome) = calls.join_next().await {
        let (a, g) = outcome.unwrap();
        answered += a;
        gave_up += g;
    }
    assert_eq!(answered, 360);
    assert!(gave_up > 0, "no call reached its deadline");
}

#[tokio::test]
async fn a_call_to_a_server_that_never_answers_ends_at_its_deadline() {
    // A listener that accepts and says nothing, as a proxy with no server
    // behind it does: connecting and the command share one deadline.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let client = redis::Client::open(format!("redis://{addr}")).unwrap();
    let shared = SharedConnection::new(client, Duration::from_millis(300));
    let started = std::time::Instant::now();
    let error = shared
        .query::<String>(&redis::cmd("PING"))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(error.is_timeout(), "{error}");
    // The deadline, with room for a busy machine; never one wait per step.
    assert!(took < Duration::from_millis(600), "took {took:?}");
    held.abort();
}
