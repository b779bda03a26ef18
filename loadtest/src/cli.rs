//! The command line: the scenarios, their options, and the target's.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::service::Launch;
use crate::{
    abuse, asyncsale, failover, groupcommit, jwt, lab, lifecycle, lockbench, speed, userlocks,
    waitingroom, webhooks,
};

#[derive(Parser)]
#[command(about = "Load tests for seckill: no oversell, and how fast")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub scenario: Scenario,
    #[command(flatten)]
    pub target: TargetArgs,
    /// Write the run's tables into the guide (docs/guide/src/measured/),
    /// replacing what an earlier run wrote there.
    #[arg(long, global = true)]
    pub record: bool,
}

#[derive(Args)]
pub(crate) struct TargetArgs {
    /// Test this running service instead of starting one.
    #[arg(long, global = true, requires = "admin_token")]
    pub url: Option<String>,
    /// The admin token of the service given by --url.
    #[arg(long, global = true, env = "SECKILL_ADMIN_TOKEN")]
    pub admin_token: Option<String>,
    /// The seckill binary to start (default: built next to this driver).
    #[arg(long, global = true)]
    pub seckill_bin: Option<PathBuf>,
    /// SECKILL_PG_POOL for the service this driver starts.
    #[arg(long, global = true)]
    pub pg_pool: Option<u32>,
    /// Keep the database and the Redis keys of the service this driver starts.
    #[arg(long, global = true)]
    pub keep_db: bool,
    /// The database of the service given by --url, for pgbench and SQL
    /// checks (a service this driver starts is known already).
    #[arg(long, global = true)]
    pub database_url: Option<String>,
    /// Seconds of each pgbench run (one per client count).
    #[arg(long, global = true, default_value_t = 3)]
    pub pgbench_seconds: u64,
}

impl TargetArgs {
    /// Refuses `--url` for a scenario that starts its own instances:
    /// `what` says what it starts and why, e.g. "abuse starts its own
    /// instances (...)".
    pub(crate) fn starts_its_own(&self, what: &str) -> anyhow::Result<()> {
        if self.url.is_some() {
            anyhow::bail!("{what}; drop --url");
        }
        Ok(())
    }

    /// `instances` of the service this driver starts, with `env` added.
    pub(crate) fn launch(&self, instances: usize, env: Vec<(String, String)>) -> Launch {
        Launch {
            seckill_bin: self.seckill_bin.clone(),
            pg_pool: self.pg_pool,
            keep_db: self.keep_db,
            instances,
            env,
            lab: false,
            redis_url: testkit::redis_url(),
        }
    }
}

/// The flash crowd of a comparison (`groupcommit`, `async`): users with
/// three requests each, in random order, for scarce stock. Their kill runs
/// take twice the users, with stock for half of them.
#[derive(Args, Clone)]
pub(crate) struct CrowdArgs {
    /// Users of the flash crowd (three requests each).
    #[arg(long, default_value_t = 10_000)]
    pub flash_users: i64,
    /// Units on sale to the flash crowd.
    #[arg(long, default_value_t = 100)]
    pub flash_stock: i64,
    /// Connections of the flash crowd.
    #[arg(long, default_value_t = 1_000)]
    pub flash_connections: usize,
    /// Units each user of the flash crowd asks for: a number, or a range
    /// such as `1-3` (each user its own ask; the voucher allows the most).
    #[arg(long, default_value = "1")]
    pub quantity: crate::units::Quantities,
}

#[derive(Subcommand)]
pub(crate) enum Scenario {
    /// A crowd of users, a few requests each in random order, for scarce stock.
    Flash(FlashArgs),
    /// One user, many concurrent requests: exactly one order.
    Hammer(HammerArgs),
    /// Distinct users against stock that cannot run out: orders per second.
    Throughput(TimedArgs),
    /// A sold-out voucher flooded: rejections per second, beside /healthz.
    Soldout(TimedArgs),
    /// The crowd's scenarios in turn (flash, hammer, throughput, soldout),
    /// with their default sizes, and the ceilings.
    All,
    /// Mint tokens through --url's admin API into a JSON file for k6/oha.
    Tokens(TokensArgs),
    /// The lock library alone: lock+unlock pairs/s beside raw EVALSHA, and
    /// a waiter's wake-up delay after an unlock.
    Lock(lockbench::LockArgs),
    /// Every lab strategy on one and two instances, with and without a
    /// stall past the lease: which anomalies appear (LAB.md).
    Lab(lab::LabArgs),
    /// Group commit against one order per transaction, on one and two
    /// instances, and with one of two instances killed mid-crowd.
    Groupcommit(groupcommit::GroupCommitArgs),
    /// Async (Redis-first) sales beside the sync path: accepted/s against
    /// /healthz, accepted -> confirmed, the writers' drain rate against
    /// group commit's, an async flash crowd; the goals judged.
    Async(asyncsale::AsyncArgs),
    /// What a purchase costs the server beside /healthz: CPU µs per request
    /// by process, Redis commands per purchase and PINGs, the rates and
    /// their ratios, sync and async, in one run (the speed goals judged).
    Speed(speed::SpeedArgs),
    /// The order lifecycle on two instances: payments racing the deadline,
    /// delivered twice; cancels; expiry under load and all at once; returned
    /// units sold again; conservation sampled throughout.
    Lifecycle(lifecycle::LifecycleArgs),
    /// An honest crowd of buyers beside each attack the service's limits
    /// are for (floods from one address, one token on many connections, a
    /// bot farm, slow bodies), on instances of its own with limits on;
    /// what a refused request costs beside /healthz.
    Abuse(abuse::AbuseArgs),
    /// The botnet's reads from a process of their own (`loadtest abuse`
    /// starts it for the rows through the front).
    #[command(hide = true)]
    Flood(abuse::FloodArgs),
    /// A sale behind a waiting room on instances of its own: a crowd
    /// joining before the start, another after it, bots joining again and
    /// again, everyone polling as told; fairness, pace, no purchase without
    /// an admission, a poll's CPU beside /healthz, proof of work's cost.
    Waitingroom(waitingroom::WaitingRoomArgs),
    /// A sale through `kill -9`s of the Postgres primary, on a three-node
    /// Patroni cluster of its own (scripts/ha.sh): per kill, the time to
    /// the next committed order, the 503s, answered orders missing (none),
    /// throughput before and after; single-node vs replicated throughput.
    Failover(failover::FailoverArgs),
    /// The same binary with the per-user lock on and off
    /// (SECKILL_USER_LOCKS), two instances, rounds alternating the two: a
    /// crowd sending each user's purchases at once over both instances,
    /// and a flash crowd; what the lock buys and costs, with the spread.
    Userlocks(userlocks::UserLocksArgs),
    /// The order events pushed to a receiver of the driver's own, which
    /// checks every signature: the sale with webhooks off against on
    /// (orders/s, every order.created received, the delivery lag), the
    /// receiver down mid-sale (the rate, the backlog's drain), and an
    /// instance killed mid-delivery (every event delivered, in order).
    Webhooks(webhooks::WebhooksArgs),
    /// What signing in with the shop's JWT costs the server beside the
    /// service's own token: CPU per purchase by process with fresh RS256
    /// and ES256 JWTs, and with RS256 JWTs verified already.
    Jwt(jwt::JwtArgs),
}

#[derive(Args, Clone)]
pub(crate) struct TokensArgs {
    /// Users 1..=N get a token.
    #[arg(long, default_value_t = 10_000)]
    pub users: i64,
    /// Where to write `[{"user_id": .., "token": ".."}, ...]`.
    #[arg(long, default_value = "tokens.json")]
    pub out: PathBuf,
}

#[derive(Args, Clone)]
pub(crate) struct FlashArgs {
    #[arg(long, default_value_t = 10_000)]
    pub users: i64,
    #[arg(long, default_value_t = 100)]
    pub stock: i64,
    /// Requests per user.
    #[arg(long, default_value_t = 3)]
    pub per_user: usize,
    #[arg(long, default_value_t = 1_000)]
    pub connections: usize,
    /// Units each user asks for: a number, or a range such as `1-3` (each
    /// user its own ask; the voucher allows the most).
    #[arg(long, default_value = "1")]
    pub quantity: crate::units::Quantities,
    /// Instances of the service this driver starts (with `--url`, the one
    /// given); the users are dealt to them in turn.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
}

#[derive(Args, Clone)]
pub(crate) struct HammerArgs {
    #[arg(long, default_value_t = 10_000)]
    pub requests: usize,
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
}

#[derive(Args, Clone)]
pub(crate) struct TimedArgs {
    /// Seconds of load (throughput: 20, soldout: 10 when not given).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Distinct users with tokens.
    #[arg(long, default_value_t = 100_000)]
    pub users: i64,
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        // Clap checks every subcommand's arguments only when one is used:
        // two flattened flags with one id would panic at that moment.
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "loadtest",
            "async",
            "--flash-users",
            "7",
            "--flash-stock",
            "3",
        ])
        .expect("async parses");
        let Scenario::Async(args) = cli.scenario else {
            panic!("not the async scenario")
        };
        assert_eq!((args.crowd.flash_users, args.crowd.flash_stock), (7, 3));
        assert_eq!(args.crowd.flash_connections, 1_000);
    }
}
