//! What a poll costs the service's CPU beside `/healthz`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

use super::{side_room, WaitingRoomArgs};
use crate::api::Admin;
use crate::cpu;
use crate::drive::Request;
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
    let bases: Vec<Arc<str>> = bases.iter().map(|b| Arc::from(b.as_str())).collect();
    let on = |i: usize| bases[i % bases.len()].clone();
    let healthz = || async {
        let plan = (0..n).map(|i| Request::get("/healthz").on(on(i))).collect();
        let (tally, cpu) = cpu::per_request(target, plan, args.connections, "healthz").await;
        (cpu::service(&cpu), tally.rps())
    };
    let (first, healthz_first_rate) = healthz().await;
    let path = format!("/vouchers/{voucher}/queue");
    let polls = (0..n)
        .map(|i| {
            let (user, ticket) = &tickets[i % tickets.len()];
            Request::get(&path)
                .on(on(i + 1))
                .by(tokens[*user].clone())
                .with_ticket(ticket.as_str().into())
        })
        .collect();
    let (polled, cpu) = cpu::per_request(target, polls, args.connections, "polls").await;
    let (last, healthz_last_rate) = healthz().await;
    let refused = polled
        .statuses
        .into_iter()
        .filter(|(answer, _)| !answer.starts_with('2'))
        .collect();
    Ok(PollCost {
        polls: n,
        poll_us: cpu::service(&cpu),
        healthz_us: (first + last) / 2.0,
        healthz_runs_us: [first, last],
        polls_per_second: polled.requests as f64 / polled.elapsed.as_secs_f64().max(1e-9),
        healthz_per_second: (healthz_first_rate + healthz_last_rate) / 2.0,
        refused,
    })
}
