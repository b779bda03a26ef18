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

use crate::service::Target;
use crate::TargetArgs;
use cost::weigh_refusal;
pub(crate) use flood::{flood_process, FloodArgs};
use report::finish;
use row::{run_row, Row, Through};

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
    /// Where the rows through the front run: `auto` puts the front (nginx)
    /// and the botnet's flood (a process of its own) on the last core, the
    /// instances and the honest crowd's driver on the others, as if the
    /// front and the bots were machines of their own (two cores or more);
    /// `FRONT:ORIGIN` gives both core lists (`taskset`'s syntax); `none`
    /// leaves every process on every core.
    #[arg(long, default_value = "auto")]
    pub front_cpus: String,
    /// Rounds of the rows through the front (the crowd alone through it,
    /// then beside the botnet's reads), taking turns; judged on the median.
    #[arg(long, default_value_t = 3)]
    pub front_rounds: usize,
}

/// The cores of the rows through the front: the front and the botnet's
/// flood on `front`, the instances and this driver on `origin`; every
/// process on `all` otherwise.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Placement {
    pub front: String,
    pub origin: String,
    pub all: String,
}

impl Placement {
    /// `--front-cpus` on a machine of `cores` cores; `None` for `none`, or
    /// for `auto` on one core.
    fn parse(arg: &str, cores: usize) -> anyhow::Result<Option<Self>> {
        let all = format!("0-{}", cores.max(1) - 1);
        match arg {
            "none" => Ok(None),
            "auto" if cores < 2 => Ok(None),
            "auto" => Ok(Some(Self {
                front: (cores - 1).to_string(),
                origin: if cores == 2 {
                    "0".into()
                } else {
                    format!("0-{}", cores - 2)
                },
                all,
            })),
            given => match given.split_once(':') {
                Some((front, origin)) if !front.is_empty() && !origin.is_empty() => {
                    Ok(Some(Self {
                        front: front.into(),
                        origin: origin.into(),
                        all,
                    }))
                }
                _ => anyhow::bail!("--front-cpus: `auto`, `none` or FRONT:ORIGIN, not {given:?}"),
            },
        }
    }

    /// Puts every thread of `pids` on `cpus` (`taskset -a -p -c`).
    fn pin(pids: &[u32], cpus: &str) -> anyhow::Result<()> {
        for pid in pids {
            let status = std::process::Command::new("taskset")
                .args(["-a", "-p", "-c", cpus, &pid.to_string()])
                .stdout(std::process::Stdio::null())
                .status()
                .map_err(|e| anyhow::anyhow!("taskset: {e} (util-linux)"))?;
            anyhow::ensure!(status.success(), "taskset -a -p -c {cpus} {pid}: {status}");
        }
        Ok(())
    }
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
    target.starts_its_own(
        "abuse starts its own instances (it sets their limits, trusted proxy and body deadline)",
    )?;
    let env = service_env(args);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let placement = Placement::parse(&args.front_cpus, cores)?
        .filter(|_| args.attacks.iter().any(|a| a.through_front()));
    // Placed, the rows use a Redis of their own, so that it can be put on
    // the origin's cores without moving the machine's shared one.
    let own_redis = match &placement {
        Some(_) => Some(testkit::OwnRedis::try_start_with(&[])?),
        None => None,
    };
    let mut launch = target.launch(args.instances.max(1), env.clone());
    if let Some(redis) = &own_redis {
        launch.redis_url = redis.url();
    }
    let redis_pid = own_redis.as_ref().and_then(testkit::OwnRedis::pid);
    let result = launch
        .run(async |service| rows_of(service, args, placement.as_ref(), redis_pid).await)
        .await;
    drop(own_redis);
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

async fn rows_of(
    service: &Target,
    args: &AbuseArgs,
    placement: Option<&Placement>,
    redis_pid: Option<u32>,
) -> anyhow::Result<Vec<Row>> {
    let admin = service.admin();
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
            .filter(|a| *a != Attack::Nobody && !a.through_front() && args.attacks.contains(a))
            .map(|a| (a, false)),
    );
    // The rows through the front take turns, `--front-rounds` times: each
    // botnet row is judged against the crowd alone through the front just
    // before it, and the goal on the median of the rounds.
    for _ in 0..args.front_rounds.max(1) {
        attacks.extend(
            [Attack::FrontAlone, Attack::FrontBotnetReads]
                .into_iter()
                .filter(|a| args.attacks.contains(a))
                .map(|a| (a, false)),
        );
    }
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
        let cpus = placement.as_ref().map(|p| p.front.as_str());
        Some(testkit::Front::start_on(&instances, cpus)?)
    } else {
        None
    };
    let mut rows: Vec<Row> = Vec::with_capacity(attacks.len());
    for (attack, again) in attacks {
        let front = front.as_ref().filter(|_| attack.through_front());
        let pinned = placement.filter(|_| front.is_some());
        let origin = origin_processes(service, redis_pid);
        if let Some(placement) = pinned {
            Placement::pin(&origin, &placement.origin)?;
        }
        let through = front.map(|front| Through {
            front,
            placement: pinned,
        });
        let row = run_row(service, &admin, args, &people, attack, again, through).await;
        if let Some(placement) = pinned {
            Placement::pin(&origin, &placement.all)?;
        }
        let mut row = row?;
        if attack == Attack::FrontBotnetReads {
            row.baseline = rows
                .iter()
                .rfind(|r| r.attack == Attack::FrontAlone)
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

/// The origin's side of the machine: the instances, this driver (the
/// honest crowd's), the Postgres backends serving the run's database and
/// the run's own Redis.
fn origin_processes(service: &Target, redis: Option<u32>) -> Vec<u32> {
    let mut pids: Vec<u32> = (0..service.bases.len())
        .filter_map(|i| service.pid(i))
        .collect();
    pids.push(std::process::id());
    pids.extend(redis);
    if let Some(database) = service
        .database_url
        .as_deref()
        .and_then(|url| url.rsplit('/').next())
    {
        pids.extend(crate::cpu::backends_of(database));
    }
    pids
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
    fn the_front_takes_the_last_core_unless_told_otherwise() {
        let two = Placement::parse("auto", 2).unwrap().unwrap();
        assert_eq!(
            (two.front.as_str(), two.origin.as_str(), two.all.as_str()),
            ("1", "0", "0-1")
        );
        let four = Placement::parse("auto", 4).unwrap().unwrap();
        assert_eq!((four.front.as_str(), four.origin.as_str()), ("3", "0-2"));
        assert_eq!(Placement::parse("auto", 1).unwrap(), None);
        assert_eq!(Placement::parse("none", 8).unwrap(), None);
        let given = Placement::parse("2-3:0-1", 4).unwrap().unwrap();
        assert_eq!(
            (given.front.as_str(), given.origin.as_str()),
            ("2-3", "0-1")
        );
        assert!(Placement::parse("1", 2).is_err());
        assert!(Placement::parse(":0", 2).is_err());
    }

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
