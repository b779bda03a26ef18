//! The floods: one attacker's requests over and over beside the crowd.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ATTACKER;
use crate::drive::{self, Request, Tally};

/// `requests` over and over, in turn, over `connections` connections of
/// its own (spread over the instances) until `stop`; `ready` is sent once
/// they are open. No progress bar: the honest crowd's runs beside it.
pub(super) async fn flood_until(
    bases: Vec<String>,
    requests: Vec<Request>,
    connections: usize,
    stop: Arc<AtomicBool>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Tally {
    let connections = connections.max(1);
    let client = drive::client(connections);
    let address = requests
        .first()
        .and_then(|r| r.from.clone())
        .unwrap_or_else(|| ATTACKER.into());
    let opening: Vec<_> = (0..connections)
        .map(|c| {
            let request = client
                .get(format!("{}/healthz", bases[c % bases.len()]))
                .header("x-forwarded-for", &*address)
                .timeout(Duration::from_secs(5));
            tokio::spawn(async move {
                if let Ok(response) = request.send().await {
                    let _ = response.bytes().await;
                }
            })
        })
        .collect();
    for opened in opening {
        let _ = opened.await;
    }
    let _ = ready.send(());
    let started = Instant::now();
    let requests = Arc::new(requests);
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..connections)
        .map(|c| {
            let (client, requests, next, stop) =
                (client.clone(), requests.clone(), next.clone(), stop.clone());
            let base = bases[c % bases.len()].clone();
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let request = &requests[i % requests.len()];
                    answers.push(drive::exchange(&client, &base, request).await);
                }
                answers
            })
        })
        .collect();
    let mut tally = Tally::starting_at(started);
    for worker in workers {
        for answered in worker.await.unwrap_or_default() {
            tally.record(answered);
        }
    }
    tally.elapsed = started.elapsed();
    tally
}
