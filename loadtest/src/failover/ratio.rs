//! The price of synchronous replication: sync purchases per second on the
//! cluster beside the shared single node.

use std::time::{Duration, Instant};

use serde_json::json;

use super::crowd::{rate, Crowd};
use super::FailoverArgs;
use crate::api::SaleMode;
use crate::round;
use crate::service::Target;

/// Purchases of a sync voucher per second for `seconds`, on `target`'s
/// service: one side of the single-node vs replicated comparison.
async fn sync_rate(
    target: &Target,
    secret: &str,
    connections: usize,
    seconds: u64,
) -> anyhow::Result<f64> {
    let voucher = target.admin().endless_voucher(SaleMode::Sync).await?;
    let crowd = Crowd::start(&target.base, voucher, secret, connections);
    // A second of warm-up: connections opened, statements prepared.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let from = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let answers = crowd.finish().await;
    Ok(rate(&answers, 200, from, Duration::from_secs(seconds)))
}

/// Sync purchases/s with synchronous replication (the cluster) against a
/// single node (the shared server), `ratio_rounds` rounds back to back so
/// that both sides see the machine's same moods.
pub(super) async fn replication_price(
    cluster: &Target,
    single: &Target,
    secret: &str,
    args: &FailoverArgs,
) -> anyhow::Result<serde_json::Value> {
    let (mut replicated, mut alone) = (Vec::new(), Vec::new());
    for round in 1..=args.ratio_rounds {
        say!(
            "replication's price, round {round}/{}: {} s of sync purchases on the cluster and on the single node",
            args.ratio_rounds,
            args.ratio_seconds
        );
        // Each side first in every other round: neither always meets the
        // machine warmed by the other.
        let rate = |target| sync_rate(target, secret, args.connections, args.ratio_seconds);
        if round % 2 == 1 {
            replicated.push(rate(cluster).await?);
            alone.push(rate(single).await?);
        } else {
            alone.push(rate(single).await?);
            replicated.push(rate(cluster).await?);
        }
    }
    let median = |rates: &[f64]| {
        let mut sorted = rates.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    };
    let ratio = median(&replicated) / median(&alone);
    let each: Vec<f64> = replicated
        .iter()
        .zip(&alone)
        .map(|(r, a)| round(r / a))
        .collect();
    println!(
        "sync purchases/s, median of {} rounds: single node {:.0}, synchronous replication {:.0}: \
         ratio {ratio:.2} (goal >= 0.7; per round {each:?})",
        args.ratio_rounds,
        median(&alone),
        median(&replicated)
    );
    Ok(json!({
        "rounds": args.ratio_rounds,
        "seconds": args.ratio_seconds,
        "replicated_sync_per_sec": replicated.iter().map(|r| round(*r)).collect::<Vec<_>>(),
        "single_node_sync_per_sec": alone.iter().map(|r| round(*r)).collect::<Vec<_>>(),
        "ratio_per_round": each,
        "replicated_vs_single": round(ratio),
        "met": ratio >= 0.7,
    }))
}
