//! `loadtest abuse`: an honest crowd of buyers beside each attack the
//! service's limits are for (floods of cheap reads, one token on many
//! connections, a bot farm behind one address, bodies sent a byte a
//! second), on instances of its own with those limits on; what each attack
//! costs the honest buyers, what the attacker got, and what a refused
//! request costs the service beside `/healthz`.

mod cost;
mod flood;
mod report;
mod row;
mod slow;

use std::sync::Arc;

use clap::{Args, ValueEnum};

use crate::api::Admin;
use crate::service::Target;
use crate::TargetArgs;
use cost::weigh_refusal;
use report::finish;
use row::{run_row, Row};

#[derive(Args, Clone)]
pub struct AbuseArgs {
    /// Seconds of each row: the honest crowd's run, the attacker's beside it.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Connections of the honest crowd.
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
    /// Honest buyers with tokens, each from an address of its own; each
    /// buys once per row (every row sells a voucher of its own), and a row
    /// that uses them all up ends early and says so.
    #[arg(long, default_value_t = 100_000)]
    pub users: i64,
    /// Connections of each attacker of the floods (rows 2 to 5).
    #[arg(long, default_value_t = 200)]
    pub attack_connections: usize,
    /// Users of the bot farm behind one address (each with a valid token).
    #[arg(long, default_value_t = 10_000)]
    pub bots: i64,
    /// Connections that send a body one byte a second.
    #[arg(long, default_value_t = 300)]
    pub slow_connections: usize,
    /// The Content-Length those bodies declare (the service's limit is
    /// 2 MiB: at it, not over, so that the body is waited for).
    #[arg(long, default_value_t = 2_097_152)]
    pub slow_length: u64,
    /// SECKILL_BODY_TIMEOUT_MS of the instances: the longest a body may
    /// take to arrive, whole.
    #[arg(long, default_value_t = 3_000)]
    pub body_timeout_ms: u64,
    /// SECKILL_LIMIT_DELAY_MS of the instances: how long a refusal is held
    /// before it is sent (the service's default; 0 answers at once).
    #[arg(long, default_value_t = 500)]
    pub limit_delay_ms: u64,
    /// SECKILL_LIMIT_PER_ADDRESS of the instances (requests per second of
    /// one client address, burst of the same size; 0: no limit).
    #[arg(long, default_value_t = 50)]
    pub limit_per_address: u32,
    /// SECKILL_LIMIT_PER_USER of the instances (purchase, order and queue
    /// routes; 0: no limit).
    #[arg(long, default_value_t = 5)]
    pub limit_per_user: u32,
    /// Instances of the service, sharing the database and Redis.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// The attacks to run, beside the honest crowd alone (always run: the
    /// others are judged against it).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Attack::ALL)]
    pub attacks: Vec<Attack>,
    /// Addresses of the botnets (and accounts of the botnet of accounts).
    #[arg(long, default_value_t = 5_000)]
    pub botnet_addresses: usize,
    /// SECKILL_SHED_DELAY_MS of the instances: the queueing delay at which
    /// they shed the least critical requests (0: never).
    #[arg(long, default_value_t = 2)]
    pub shed_delay_ms: u64,
    /// Requests of each kind in the phase that weighs a refused request
    /// against `/healthz` in the service's CPU (0: no such phase).
    #[arg(long, default_value_t = 20_000)]
    pub cpu_requests: usize,
}

/// One row's attacker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Attack {
    /// No attacker: the honest crowd alone, the baseline.
    Nobody,
    /// Anonymous `GET /vouchers/{id}` from one address.
    VoucherFlood,
    /// Anonymous `GET /readyz` from one address.
    ReadyzFlood,
    /// One user's token on every connection, `POST /seckill/{id}`.
    OneToken,
    /// Many valid users' purchases, all from one address.
    BotFarm,
    /// Bodies declared large and sent one byte a second.
    SlowBodies,
    /// A botnet's anonymous `GET /vouchers/{id}`, every request from
    /// another of `--botnet-addresses` addresses.
    BotnetReads,
    /// A botnet of accounts: `--botnet-addresses` users, each with a token
    /// and an address of its own, buying another voucher over and over
    /// (one order each, then `already_purchased`).
    BotnetAccounts,
    /// No attacker, the honest crowd through the shipped front
    /// (`deploy/nginx.conf`): the baseline of the next row.
    FrontAlone,
    /// The botnet's reads and the honest crowd, both through the front.
    FrontBotnetReads,
}

impl Attack {
    const ALL: [Attack; 10] = [
        Self::Nobody,
        Self::VoucherFlood,
        Self::ReadyzFlood,
        Self::OneToken,
        Self::BotFarm,
        Self::SlowBodies,
        Self::BotnetReads,
        Self::BotnetAccounts,
        Self::FrontAlone,
        Self::FrontBotnetReads,
    ];

    /// Whether the row's requests go through the shipped front.
    fn through_front(self) -> bool {
        matches!(self, Self::FrontAlone | Self::FrontBotnetReads)
    }

    fn name(self) -> &'static str {
        match self {
            Self::Nobody => "nobody (alone)",
            Self::VoucherFlood => "GET /vouchers/{id} flood",
            Self::ReadyzFlood => "GET /readyz flood",
            Self::OneToken => "one token, POST /seckill",
            Self::BotFarm => "bot farm, one address",
            Self::SlowBodies => "slow bodies",
            Self::BotnetReads => "botnet reads, rotating addresses",
            Self::BotnetAccounts => "botnet of accounts buying",
            Self::FrontAlone => "nobody, through the front",
            Self::FrontBotnetReads => "botnet reads, through the front",
        }
    }

    /// The prefix of the honest crowd's progress bar in this row.
    fn label(self) -> &'static str {
        match self {
            Self::Nobody => "alone",
            Self::VoucherFlood => "vs vouchers",
            Self::ReadyzFlood => "vs readyz",
            Self::OneToken => "vs one token",
            Self::BotFarm => "vs bot farm",
            Self::SlowBodies => "vs slow",
            Self::BotnetReads => "vs botnet reads",
            Self::BotnetAccounts => "vs botnet accounts",
            Self::FrontAlone => "front, alone",
            Self::FrontBotnetReads => "front vs botnet reads",
        }
    }
}

/// The address every flood claims (TEST-NET-3: a header value only, the
/// driver connects to the instances' loopback address and nowhere else).
const ATTACKER: &str = "203.0.113.7";
/// The address whose requests the CPU phase has refused.
const REFUSED: &str = "198.51.100.9";

/// Honest buyer `i`'s address: one of its own (10.0.0.0/8), derived from
/// its user id.
fn honest_address(i: i64) -> String {
    numbered([10, 0], 255, i as usize)
}

/// Botnet member `i`'s address (100.64.0.0/10 shared address space).
fn botnet_address(i: usize) -> String {
    numbered([100, 64], 63, i)
}

/// Slow connection `i`'s address: one each, so that the limit per address
/// does not end them before the body deadline can.
fn slow_address(i: usize) -> String {
    numbered([172, 16], 15, i)
}

/// One of the addresses the CPU phase's `/healthz` requests take turns on.
fn healthz_address(i: usize) -> String {
    numbered([100, 64], 63, i)
}

/// The `i`th address of a block: its first octet, then its second from
/// `block[1]` up (`i`'s bits above 16, masked by `spread`), then `i`'s low
/// 16 bits.
fn numbered(block: [usize; 2], spread: usize, i: usize) -> String {
    format!(
        "{}.{}.{}.{}",
        block[0],
        block[1] + ((i >> 16) & spread),
        (i >> 8) & 255,
        i & 255
    )
}

/// Runs every row, then the CPU phase; `Ok(false)` when an invariant
/// broke or an honest buyer was answered 5xx (503 above all).
pub async fn run(target: &TargetArgs, args: &AbuseArgs) -> anyhow::Result<bool> {
    if target.url.is_some() {
        anyhow::bail!("abuse starts its own instances (it sets their limits, trusted proxy and body deadline); drop --url");
    }
    let env = service_env(args);
    let service = Target::start(target.launch(args.instances.max(1), env.clone())).await?;
    let result = rows_of(&service, args).await;
    service.stop().await;
    let rows = result?;
    let cost = if args.cpu_requests > 0 {
        Some(weigh_refusal(target, args, env).await?)
    } else {
        None
    };
    Ok(finish(args, &rows, cost.as_ref()))
}

/// The instances' settings: the limits and body deadline under test.
fn service_env(args: &AbuseArgs) -> Vec<(String, String)> {
    let payment_secret = format!("load-payment-secret-{}", uuid::Uuid::new_v4().simple());
    vec![
        ("SECKILL_TRUSTED_PROXIES".into(), "127.0.0.1".into()),
        (
            "SECKILL_LIMIT_PER_ADDRESS".into(),
            args.limit_per_address.to_string(),
        ),
        (
            "SECKILL_LIMIT_PER_USER".into(),
            args.limit_per_user.to_string(),
        ),
        (
            "SECKILL_BODY_TIMEOUT_MS".into(),
            args.body_timeout_ms.to_string(),
        ),
        (
            "SECKILL_LIMIT_DELAY_MS".into(),
            args.limit_delay_ms.to_string(),
        ),
        (
            "SECKILL_SHED_DELAY_MS".into(),
            args.shed_delay_ms.to_string(),
        ),
        // A notification is read whole before its signature is checked:
        // without a secret the route would refuse it before any body.
        ("SECKILL_PAYMENT_SECRET".into(), payment_secret),
    ]
}

async fn rows_of(service: &Target, args: &AbuseArgs) -> anyhow::Result<Vec<Row>> {
    let admin = Admin::new(service);
    let users = args.users.max(1);
    let bots = args.bots.max(1);
    eprintln!(
        "abuse: minting {} tokens (honest buyers, the attacker, its bots)",
        users + 1 + bots
    );
    let botnet = args.botnet_addresses.max(1) as i64;
    let tokens = admin.shared_tokens(1, users + 1 + bots + botnet).await?;
    let (honest, rest) = tokens.split_at(usize::try_from(users).unwrap_or(0));
    let (attacker, rest) = rest.split_at(1);
    let (bots, accounts) = rest.split_at(usize::try_from(bots).unwrap_or(0));
    let addresses: Vec<Arc<str>> = (1..=users).map(|i| honest_address(i).into()).collect();
    let mut attacks = vec![(Attack::Nobody, false)];
    attacks.extend(
        Attack::ALL
            .into_iter()
            .filter(|a| *a != Attack::Nobody && args.attacks.contains(a))
            .map(|a| (a, false)),
    );
    if attacks.len() > 1 {
        attacks.push((Attack::Nobody, true));
    }
    let people = People {
        honest,
        addresses: &addresses,
        attacker: &attacker[0],
        bots,
        accounts,
        botnet: (0..args.botnet_addresses.max(1))
            .map(|i| botnet_address(i).into())
            .collect(),
    };
    let front = if attacks.iter().any(|(a, _)| a.through_front()) {
        let instances: Vec<std::net::SocketAddr> = service
            .bases
            .iter()
            .filter_map(|b| b.trim_start_matches("http://").parse().ok())
            .collect();
        Some(testkit::Front::start(&instances).map_err(anyhow::Error::msg)?)
    } else {
        None
    };
    let mut rows: Vec<Row> = Vec::with_capacity(attacks.len());
    for (attack, again) in attacks {
        let via = front
            .as_ref()
            .filter(|_| attack.through_front())
            .map(testkit::Front::base);
        let mut row = run_row(service, &admin, args, &people, attack, again, via).await?;
        if attack == Attack::FrontBotnetReads {
            row.baseline = rows
                .iter()
                .find(|r| r.attack == Attack::FrontAlone)
                .map(|r| (r.rate, r.honest.ms(0.99)));
        }
        eprintln!(
            "{}: honest {:.0} purchases/s, p99 {:.2} ms; queueing delay mean {:.1} ms, highest {:.1} ms; {}",
            row.name(),
            row.rate,
            row.honest.ms(0.99),
            row.delay_ms.0,
            row.delay_ms.1,
            if row.check.ok() {
                "invariants ok"
            } else {
                "INVARIANT BROKEN"
            }
        );
        rows.push(row);
    }
    Ok(rows)
}

/// Who takes part in the rows: the honest buyers' tokens and addresses,
/// the attacker's one token and its bots' tokens.
struct People<'a> {
    honest: &'a [Arc<str>],
    addresses: &'a [Arc<str>],
    attacker: &'a Arc<str>,
    bots: &'a [Arc<str>],
    /// The botnet of accounts' tokens, one per botnet address.
    accounts: &'a [Arc<str>],
    /// The botnets' addresses.
    botnet: Vec<Arc<str>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_distinct_per_buyer_and_slow_connection() {
        let honest: std::collections::HashSet<String> = (1..=70_000).map(honest_address).collect();
        assert_eq!(honest.len(), 70_000);
        assert_eq!(honest_address(1), "10.0.0.1");
        assert_eq!(honest_address(65_537), "10.1.0.1");
        let slow: std::collections::HashSet<String> = (0..1_000).map(slow_address).collect();
        assert_eq!(slow.len(), 1_000);
        assert!(slow.iter().all(|a| a.parse::<std::net::Ipv4Addr>().is_ok()));
    }
}
