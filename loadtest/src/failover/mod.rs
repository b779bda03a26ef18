//! `loadtest failover`: a sale through `kill -9`s of the Postgres primary.
//! It owns its cluster (three Patroni nodes in synchronous mode, etcd,
//! haproxy: `scripts/ha.sh` in a directory of its own under the temp
//! directory, stopped at the end whatever happened), a service whose
//! database lives on that cluster, a steady crowd of distinct buyers, and
//! the per-kill figures: how long until an order is committed again, what
//! the failover cost in 503s, whether any answered order went missing, and
//! the throughput before and after. Optionally, the price of synchronous
//! replication: the same short crowd against the shared single Postgres.

use std::time::Instant;

use clap::{Args, ValueEnum};
use serde_json::json;

use crate::api::SaleMode;
use crate::service::Target;
use crate::TargetArgs;
use kills::kills;
use ratio::replication_price;
use testkit::ha::Cluster;

/// When the run began: progress lines say how far into it they are.
static BEGAN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// A progress line on stderr, stamped with the seconds since the start.
macro_rules! say {
    ($($arg:tt)*) => {
        eprintln!(
            "failover {:7.1}s: {}",
            $crate::failover::BEGAN.get_or_init(std::time::Instant::now).elapsed().as_secs_f64(),
            format!($($arg)*)
        )
    };
}

mod books;
mod crowd;
mod kills;
mod ratio;

#[derive(Args, Clone)]
pub struct FailoverArgs {
    /// `kill -9`s of the primary, one after the other once the sale
    /// resumed and the cluster has a synchronous standby again.
    #[arg(long, default_value_t = 3)]
    pub kills: usize,
    /// How the voucher sells: sync (200 once committed) or async (202,
    /// stored later by the stream writers).
    #[arg(long, value_enum, default_value_t = FailoverMode::Sync)]
    pub mode: FailoverMode,
    /// Concurrent buyers, each a new user at every purchase.
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Seconds of sale before the first kill and after each resumption:
    /// the windows the throughput before and after is measured over.
    #[arg(long, default_value_t = 5)]
    pub window: u64,
    /// Bound, in seconds, on the wait for an order committed after a kill.
    #[arg(long, default_value_t = 60)]
    pub resume_timeout: u64,
    /// Seconds of each crowd of the single-node vs synchronous-replication
    /// comparison (0: not measured).
    #[arg(long, default_value_t = 5)]
    pub ratio_seconds: u64,
    /// Rounds of that comparison, each a crowd on the cluster then one on
    /// the single node, back to back: the ratio is of the medians.
    #[arg(long, default_value_t = 3)]
    pub ratio_rounds: usize,
    /// Async: how long the writers may take, after the sale, to store
    /// every accepted order before the run says some were lost.
    #[arg(long, default_value_t = 120)]
    pub drain_timeout: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailoverMode {
    Sync,
    Async,
}

impl FailoverMode {
    fn sale_mode(self) -> SaleMode {
        match self {
            Self::Sync => SaleMode::Sync,
            Self::Async => SaleMode::Async,
        }
    }

    /// The answer of a purchase the service took on.
    fn taken(self) -> u16 {
        match self {
            Self::Sync => 200,
            Self::Async => 202,
        }
    }
}

pub async fn run(target_args: &TargetArgs, args: &FailoverArgs) -> anyhow::Result<bool> {
    BEGAN.get_or_init(Instant::now);
    target_args.starts_its_own("failover starts its own cluster and service")?;
    say!("bringing up the cluster (scripts/ha.sh up)");
    let cluster = tokio::task::spawn_blocking(Cluster::up).await??;
    say!("cluster up, haproxy at {}", cluster.server);
    let result = crate::service::unless_interrupted(sale(&cluster, target_args, args)).await;
    say!("stopping the cluster");
    drop(cluster);
    result
}

async fn sale(
    cluster: &Cluster,
    target_args: &TargetArgs,
    args: &FailoverArgs,
) -> anyhow::Result<bool> {
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    // The service creates its database on the cluster; Target::start's
    // own name on the shared server is never created, so its drop there
    // is a no-op, and the whole cluster goes at the end.
    let database_url = format!("{}/seckill_failover_{run_id}", cluster.server);
    let secret = format!("failover-token-secret-{run_id}");
    let launch = |url: Option<&str>| {
        let mut env = vec![("SECKILL_TOKEN_SECRET".to_owned(), secret.clone())];
        if let Some(url) = url {
            env.push(("DATABASE_URL".to_owned(), url.to_owned()));
        }
        target_args.launch(1, env)
    };
    let mut target = Target::start(launch(Some(&database_url))).await?;
    // The invariants' SQL is read from the cluster, through haproxy.
    target.database_url = Some(database_url.clone());
    // The price of synchronous replication: the same binary and crowd on
    // the cluster and on the shared single server, in alternation.
    let price = if args.ratio_seconds > 0 && args.ratio_rounds > 0 {
        match Target::start(launch(None)).await {
            Ok(single) => {
                let price = replication_price(&target, &single, &secret, args).await;
                single.stop().await;
                Some(price)
            }
            Err(e) => Some(Err(e)),
        }
    } else {
        None
    };
    let price = match price.transpose() {
        Ok(price) => price,
        Err(e) => {
            target.stop().await;
            return Err(e);
        }
    };
    let result = kills(cluster, &target, &secret, &database_url, args).await;
    target.stop().await;
    let (ok, mut summary) = result?;
    if let Some(price) = price {
        summary["replication_price"] = price;
    }
    summary["ok"] = json!(ok);
    println!("{summary}");
    Ok(ok)
}
