//! What a refused request costs the service beside `/healthz`: one refused
//! by the limit per address, and a purchase by a buyer who holds an order
//! already (`already_purchased`, answered from memory).

use std::sync::Arc;

use serde_json::{json, Value};

use super::report::{statuses, Verdict};
use super::{healthz_address, AbuseArgs, REFUSED};
use crate::api::SaleMode;
use crate::cpu;
use crate::drive::Request;
use crate::service::Target;
use crate::table::Table;
use crate::{round, TargetArgs};

/// The service's CPU per request: refused by the limit, and `/healthz`.
pub(super) struct RefusalCost {
    pub requests: usize,
    /// Requests of the refused run (fewer while refusals are held).
    refused_requests: usize,
    /// Answered 429 of the refused run.
    pub refused: u64,
    /// Service µs per refused request.
    refused_us: f64,
    /// Purchases of buyers who hold an order, and how many were answered
    /// `409 already_purchased`.
    again_requests: usize,
    pub again_refused: u64,
    /// Service µs per such purchase.
    again_us: f64,
    /// Service µs per `/healthz`: the mean of a run before and one after.
    healthz_us: f64,
    healthz_runs_us: [f64; 2],
}

impl RefusalCost {
    fn ratio(&self) -> f64 {
        self.refused_us / self.healthz_us
    }

    fn again_ratio(&self) -> f64 {
        self.again_us / self.healthz_us
    }

    pub(super) fn json(&self) -> Value {
        json!({
                "requests": self.requests,
                "refused_requests": self.refused_requests,
                "refused": self.refused,
                "refused_service_us": round(self.refused_us),
                "healthz_service_us": round(self.healthz_us),
                "healthz_runs_service_us": self.healthz_runs_us.map(round),
                "ratio": round(self.ratio()),
                "already_purchased_requests": self.again_requests,
                "already_purchased": self.again_refused,
                "already_purchased_service_us": round(self.again_us),
                "already_purchased_ratio": round(self.again_ratio()),
                "goals": self.verdicts().iter().map(Verdict::json).collect::<Vec<_>>(),
        })
    }

    pub(super) fn verdicts(&self) -> Vec<Verdict> {
        vec![
            Verdict::new(
                "-",
                "service CPU per refused request / per /healthz",
                self.ratio(),
                "<= 1.5",
                |m| m <= 1.5,
            ),
            Verdict::new(
                "-",
                "service CPU per already_purchased / per /healthz",
                self.again_ratio(),
                "<= 1.5",
                |m| m <= 1.5,
            ),
        ]
    }
}

/// Weighs a refused request on an instance of its own, with `env` but
/// for the delay of a refusal.
pub(super) async fn weigh_refusal(
    target: &TargetArgs,
    args: &AbuseArgs,
    mut env: Vec<(String, String)>,
) -> anyhow::Result<RefusalCost> {
    // The refusal's own work, on an instance that sends it at once: a
    // held refusal costs a timer more, and a phase of held refusals
    // would measure mostly the waiting and the connections it takes.
    env.retain(|(name, _)| name != "SECKILL_LIMIT_DELAY_MS");
    env.push(("SECKILL_LIMIT_DELAY_MS".into(), "0".into()));
    target
        .launch(1, env)
        .run(async |service| {
            let voucher = service.admin().endless_voucher(SaleMode::Sync).await?;
            refusal_cost(service, args, voucher).await
        })
        .await
}

/// The service's CPU per request refused by the limit per address (one
/// address far over it, `GET /vouchers/{id}`) beside `/healthz` (from
/// addresses that take turns, none over its limit), measured around a
/// `/healthz` run before and one after, whose mean it is weighed against.
async fn refusal_cost(
    service: &Target,
    args: &AbuseArgs,
    voucher: i64,
) -> anyhow::Result<RefusalCost> {
    let n = args.cpu_requests;
    // Enough addresses that none goes over its limit below 100,000
    // requests a second; a new address for every request would bill the
    // limiter's new entries to /healthz.
    let turns = match args.limit_per_address {
        0 => 1,
        limit => (100_000 / limit as usize + 1).max(256),
    }
    .min(n.max(1));
    let addresses: Vec<Arc<str>> = (0..turns).map(|i| healthz_address(i).into()).collect();
    let healthz_plan = || {
        (0..n)
            .map(|i| Request::get("/healthz").with_address(addresses[i % turns].clone()))
            .collect::<Vec<_>>()
    };
    let (refused_n, refused_connections) = (n, args.connections);
    let refused_plan =
        vec![Request::get(&format!("/vouchers/{voucher}")).with_address(REFUSED.into()); refused_n];
    let connections = args.connections;
    let measure = |plan: Vec<Request>, connections: usize, label: &'static str| async move {
        let (tally, cpu) = cpu::per_request(service, plan, connections, label).await;
        (tally, cpu::service(&cpu))
    };
    let (first, first_us) = measure(healthz_plan(), connections, "cpu healthz").await;
    let (refused, refused_us) = measure(refused_plan, refused_connections, "cpu refused").await;
    // Buyers who bought once, each asking again four times (within the
    // limit per user's burst), from the addresses /healthz took turns on.
    let buyers = (n / 4).max(1);
    let tokens = service.admin().shared_tokens(1, buyers as i64).await?;
    let bought: Vec<Request> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            Request::purchase(voucher, t.clone()).with_address(addresses[i % turns].clone())
        })
        .collect();
    service.send_each(bought, connections, "cpu buy once").await;
    // The orders' own work (commits, the order events every instance
    // reads) is the purchases', not the refusals' after them.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let again_plan: Vec<Request> = (0..n)
        .map(|i| {
            Request::purchase(voucher, tokens[i % buyers].clone())
                .with_address(addresses[i % turns].clone())
        })
        .collect();
    let (again, again_us) = measure(again_plan, connections, "cpu already purchased").await;
    let (last, last_us) = measure(healthz_plan(), connections, "cpu healthz").await;
    for (what, tally) in [
        ("healthz", &first),
        ("healthz", &last),
        ("refused", &refused),
        ("already purchased", &again),
    ] {
        eprintln!("cpu phase, {what}: {}", statuses(&tally.statuses));
    }
    Ok(RefusalCost {
        requests: n,
        refused_requests: refused_n,
        refused: refused.count("429 rate_limited"),
        refused_us,
        again_requests: n,
        again_refused: again.count("409 already_purchased"),
        again_us,
        healthz_us: (first_us + last_us) / 2.0,
        healthz_runs_us: [first_us, last_us],
    })
}

pub(super) fn print_cost(cost: &RefusalCost) {
    let mut table = Table::new(["request", "requests", "refused", "service µs/request"]);
    table.row([
        "GET /healthz (mean of before and after)".to_owned(),
        cost.requests.to_string(),
        "-".to_owned(),
        format!("{:.1}", cost.healthz_us),
    ]);
    table.row([
        "GET /vouchers/{id}, one address over its limit".to_owned(),
        cost.refused_requests.to_string(),
        cost.refused.to_string(),
        format!("{:.1}", cost.refused_us),
    ]);
    table.row([
        "POST /seckill/{id} by a buyer who holds an order".to_owned(),
        cost.again_requests.to_string(),
        cost.again_refused.to_string(),
        format!("{:.1}", cost.again_us),
    ]);
    print!("\n{}", table.text());
    println!(
        "  refused / /healthz: {:.2}x, already_purchased / /healthz: {:.2}x (goals <= 1.5x; /healthz runs {:.1} and {:.1} µs; on an instance that sends refusals at once)",
        cost.ratio(),
        cost.again_ratio(),
        cost.healthz_runs_us[0],
        cost.healthz_runs_us[1]
    );
    crate::table::record("abuse", "What a refused request costs the service", &table);
}
