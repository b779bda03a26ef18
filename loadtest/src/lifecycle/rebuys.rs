//! A returned unit sold again at once: one unit, held; each round a buyer
//! on one instance hears "sold out", the holder cancels through the
//! other, and the buyer gets the unit; how long that took after the cancel.

use std::time::{Duration, Instant};

use anyhow::Context;

use crate::api::SaleMode;

use super::{priced_sale, sampled, wait_stored, Caller, Part, Stage};

/// 'rebuy-{mode}': a one-unit sale, sold out; its buyer cancels through one
/// instance while another user keeps trying through the other: how long
/// until the returned unit is bought again there.
pub(super) async fn rebuys(stage: &Stage<'_>, mode: SaleMode) -> anyhow::Result<Part> {
    let (target, admin, args) = (stage.target, &stage.admin, stage.args);
    let mut part = Part::new(format!("rebuy-{}", mode.name()));
    let caller = Caller::new(target, "", 16, args.quantity);
    let voucher = admin
        .create_sale(priced_sale(mode, 1, args.quantity, 900))
        .await?;
    let count = i64::try_from(args.rebuys).unwrap_or(0) + 1;
    let tokens = admin.tokens(stage.first_user, count).await?;
    let (code, body) = caller.buy(0, voucher, &tokens[0]).await;
    let mut holder = body["order_id"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("first purchase: {code} {body}"))?;
    let mut latency: Vec<Duration> = Vec::with_capacity(args.rebuys);
    let work = async {
        for round in 0..args.rebuys {
            let (from, to) = (round % 2, (round + 1) % 2);
            let token = &tokens[round + 1];
            // The waiter sees it sold out first (the other instance's flag).
            let (code, body) = caller.buy(to, voucher, token).await;
            if code != 409 || body["error"] != "sold_out" {
                anyhow::bail!("round {round}: before the cancel: {code} {body}");
            }
            let cancelled = caller.cancel(from, &holder).await;
            let back = Instant::now();
            if !cancelled.is(200, "cancelled", None) {
                anyhow::bail!("round {round}: cancel: {}", cancelled.describe());
            }
            loop {
                let (code, body) = caller.buy(to, voucher, token).await;
                if code == 200 || code == 202 {
                    holder = body["order_id"].as_str().unwrap_or_default().to_owned();
                    break;
                }
                if back.elapsed() > Duration::from_secs(5) {
                    anyhow::bail!("round {round}: not bought again within 5 s: {code} {body}");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            latency.push(back.elapsed());
        }
        Ok(())
    };
    sampled(&mut part, target, &[voucher], work).await?;
    latency.sort();
    let ms = |d: Option<&Duration>| d.map_or(0.0, |d| (d.as_secs_f64() * 10_000.0).round() / 10.0);
    part.fact("rounds", args.rebuys);
    part.fact("bought_again_ms_p50", ms(latency.get(latency.len() / 2)));
    part.fact("bought_again_ms_max", ms(latency.last()));
    part.fact(
        "bought_again_ms_each",
        latency.iter().map(|d| ms(Some(d))).collect::<Vec<_>>(),
    );
    if latency.last().is_some_and(|d| *d > Duration::from_secs(1)) {
        part.problems.push(format!(
            "a returned unit took {} ms to sell again",
            ms(latency.last())
        ));
    }
    let end = wait_stored(admin, voucher, Duration::from_secs(30), "stored").await?;
    if !end.conserved()
        || end.orders != 1
        || end.cancelled != i64::try_from(args.rebuys).unwrap_or(0)
    {
        part.problems.push(format!("at the end: {end:?}"));
    }
    Ok(part)
}
