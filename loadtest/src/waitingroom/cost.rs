//! What a poll costs the service's CPU beside `/healthz`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};

use super::{side_room, WaitingRoomArgs};
use crate::api::Admin;
use crate::cpu::Usage;
use crate::service::Target;

/// The service's CPU per poll and per `/healthz`.
pub(super) struct PollCost {
    pub polls: usize,
    pub poll_us: f64,
    /// The mean of a run before the polls and one after: the machine's
    /// drift during the phase is not billed to the polls.
    pub healthz_us: f64,
    pub healthz_runs_us: [f64; 2],
    pub polls_per_second: f64,
    pub healthz_per_second: f64,
    /// Answers of the polls other than 200, by answer.
    pub refused: BTreeMap<String, u64>,
}

impl PollCost {
    pub(super) fn ratio(&self) -> f64 {
        self.poll_us / self.healthz_us
    }
}

/// waiting), beside `/healthz` before and after, at the same concurrency,
/// each over every instance in turn.
pub(super) async fn poll_cost(
    target: &Target,
    admin: &Admin,
    tokens: &[Arc<str>],
    args: &WaitingRoomArgs,
) -> anyhow::Result<PollCost> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.connections)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()?;
    // Admitting one a second from a second ago: the polls find their
    // users placed and waiting, as most of a crowd is.
    let voucher = side_room(
        admin,
        "load test: a poll's cost",
        chrono::Duration::seconds(1),
        json!({ "admit_per_second": 1 }),
    )
    .await?;
    let placed = tokens.len().min(2_000);
    let bases = &target.bases;
    let url = |i: usize| format!("{}/vouchers/{voucher}/queue", bases[i % bases.len()]);
    let tickets: Vec<Option<String>> = futures_util::stream::iter(0..placed)
        .map(|i| {
            let request = http.post(url(i)).bearer_auth(&*tokens[i]);
            async move {
                let body: Value = request.send().await.ok()?.json().await.ok()?;
                Some(body["ticket"].as_str()?.to_owned())
            }
        })
        .buffered(args.connections.max(1))
        .collect()
        .await;
    let tickets: Vec<(usize, String)> = tickets
        .into_iter()
        .enumerate()
        .filter_map(|(i, t)| Some((i, t?)))
        .collect();
    if tickets.is_empty() {
        anyhow::bail!("no user of the poll-cost room could join it");
    }
    let n = args.cpu_polls;
    let healthz = |label: &'static str| {
        let http = http.clone();
        async move {
            let requests = (0..n).map(|i| http.get(format!("{}/healthz", bases[i % bases.len()])));
            weighed(target, requests, n, args.connections, label).await
        }
    };
    let (first, _, healthz_first_rate) = healthz("healthz").await;
    let polls = (0..n).map(|i| {
        let (user, ticket) = &tickets[i % tickets.len()];
        http.get(url(i + 1))
            .bearer_auth(&*tokens[*user])
            .header("x-queue-ticket", ticket)
    });
    let (poll_us, refused, polls_per_second) =
        weighed(target, polls, n, args.connections, "polls").await;
    let (last, _, healthz_last_rate) = healthz("healthz").await;
    Ok(PollCost {
        polls: n,
        poll_us,
        healthz_us: (first + last) / 2.0,
        healthz_runs_us: [first, last],
        polls_per_second,
        healthz_per_second: (healthz_first_rate + healthz_last_rate) / 2.0,
        refused,
    })
}

/// Sends `requests` with `connections` in flight; the service's CPU µs per
/// request, the answers other than 2xx, and requests per second.
async fn weighed(
    target: &Target,
    requests: impl Iterator<Item = reqwest::RequestBuilder>,
    n: usize,
    connections: usize,
    label: &str,
) -> (f64, BTreeMap<String, u64>, f64) {
    let progress = ProgressBar::new(n as u64).with_prefix(label.to_owned());
    progress.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:40}] {pos}/{len}  {per_sec}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let before = Usage::now(target).await;
    let clock = Instant::now();
    let answers: Vec<String> = futures_util::stream::iter(requests)
        .map(|request| {
            let progress = progress.clone();
            async move {
                let key = match request.send().await {
                    Ok(response) if response.status().is_success() => {
                        let _ = response.bytes().await;
                        None
                    }
                    Ok(response) => Some(response.status().as_u16().to_string()),
                    Err(_) => Some("error".to_owned()),
                };
                progress.inc(1);
                key.unwrap_or_default()
            }
        })
        .buffer_unordered(connections.max(1))
        .collect()
        .await;
    let elapsed = clock.elapsed();
    let us = Usage::now(target)
        .await
        .micros_per(&before, n as u64)
        .get("service")
        .copied()
        .unwrap_or(f64::NAN);
    progress.finish_and_clear();
    let mut refused = BTreeMap::new();
    for key in answers.into_iter().filter(|k| !k.is_empty()) {
        *refused.entry(key).or_default() += 1;
    }
    (us, refused, n as f64 / elapsed.as_secs_f64().max(1e-9))
}
