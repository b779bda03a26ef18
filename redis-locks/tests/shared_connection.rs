//! The shared connection against the local Redis (`REDIS_URL`, by default
//! `redis://127.0.0.1:6379`): calls that give up at their deadline never
//! hand their late answers to anyone else.

use std::time::Duration;

use redis_locks::SharedConnection;
use tokio::task::JoinSet;

use testkit::redis_url;

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

/// A proxy to the local Redis that, once `cut` is raised, passes nothing
/// more on the connections it had (a master frozen, or cut off without a
/// reset, behind one address) while it forwards the ones it accepts after
/// (the replica promoted behind that address).
async fn cutting_proxy(cut: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> String {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let target = testkit::redis_addr();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                continue;
            };
            let born = cut.load(Ordering::SeqCst);
            let (client_in, client_out) = client.into_split();
            let (server_in, server_out) = server.into_split();
            for (mut from, mut to) in [(client_in, server_out), (server_in, client_out)] {
                let cut = cut.clone();
                tokio::spawn(async move {
                    let mut buffer = [0_u8; 4096];
                    while let Ok(n @ 1..) = from.read(&mut buffer).await {
                        if cut.load(Ordering::SeqCst) == born
                            && to.write_all(&buffer[..n]).await.is_err()
                        {
                            break;
                        }
                    }
                });
            }
        }
    });
    format!("redis://{addr}")
}

#[tokio::test]
async fn a_connection_that_went_silent_is_left_after_its_timeout_for_a_new_one() {
    // A plain address, no Sentinel: a timeout is all the caller sees of a
    // master that went away behind it, and the next call must not queue on
    // the same dead socket.
    let cut = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let client = redis::Client::open(cutting_proxy(cut.clone()).await).unwrap();
    let shared = SharedConnection::new(client, Duration::from_millis(300));
    let ping = redis::cmd("PING");
    assert_eq!(shared.query::<String>(&ping).await.unwrap(), "PONG");
    cut.store(1, std::sync::atomic::Ordering::SeqCst);
    // A deadline of its own, shorter than the connection's: the call gives
    // up before redis-rs's own response timeout could say anything.
    let error = shared
        .query_within::<String>(Duration::from_millis(100), &ping)
        .await
        .unwrap_err();
    assert!(error.is_timeout(), "{error}");
    assert_eq!(
        shared
            .query::<String>(&ping)
            .await
            .expect("the next call connects anew"),
        "PONG"
    );
}
