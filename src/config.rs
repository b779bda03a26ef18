//! Settings: every knob of the service, read from the environment (or a
//! `.env` file, or flags), held in one value that builds the whole app.

use std::time::Duration;

use clap::Parser;

/// What stands between the service and Postgres.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PgPooler {
    /// Postgres itself, or a pooler in session mode.
    None,
    /// A pooler in transaction mode (pgbouncer's common production setup).
    Transaction,
}

/// How the service is configured. `--help` lists each variable.
#[derive(Debug, Clone, clap::Args)]
pub struct Settings {
    /// Postgres connection string; the database is created if missing.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/seckill"
    )]
    pub database_url: String,

    /// `DATABASE_URL` goes through a pooler in transaction mode (pgbouncer
    /// `pool_mode = transaction`): no named prepared statements.
    #[arg(
        long,
        env = "SECKILL_PG_POOLER",
        value_enum,
        default_value_t = PgPooler::None
    )]
    pub pg_pooler: PgPooler,

    /// A direct Postgres URL for creating the database and migrating it,
    /// when `DATABASE_URL` goes through a pooler (default: `DATABASE_URL`).
    #[arg(long, env = "SECKILL_DATABASE_DIRECT_URL")]
    pub database_direct_url: Option<String>,

    /// Redis for locks, order ids and the sold-out flags.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,

    /// Address to listen on (port 0 picks a free one).
    #[arg(long, env = "SECKILL_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: String,

    /// Bearer token for /admin/*; unset or empty, admin routes answer 403.
    #[arg(long, env = "SECKILL_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Key that signs user tokens; unset, a random one per process.
    #[arg(long, env = "SECKILL_TOKEN_SECRET", hide_env_values = true)]
    pub token_secret: Option<String>,

    /// Key of the payment provider's notification signatures (HMAC-SHA256
    /// of the raw body); unset or empty, /payments/notify answers 403.
    #[arg(long, env = "SECKILL_PAYMENT_SECRET", hide_env_values = true)]
    pub payment_secret: Option<String>,

    /// Independent Redis nodes (comma-separated URLs) for the users'
    /// purchase locks, taken as RedLocks (a majority must grant them).
    /// Unset: the locks live on REDIS_URL.
    #[arg(long, env = "SECKILL_LOCK_REDIS_URLS", value_delimiter = ',')]
    pub lock_redis_urls: Vec<String>,

    /// Prefix of every Redis key the service writes, to share one Redis.
    #[arg(long, env = "SECKILL_REDIS_PREFIX", default_value = "")]
    pub redis_prefix: String,

    /// Postgres connections (default: 4 per core). Purchases of one voucher
    /// queue for its row lock anyway; more connections only add waiters
    /// that wake and contend (BENCHMARKS.md shows the curve).
    #[arg(long, env = "SECKILL_PG_POOL")]
    pub pg_pool: Option<u32>,

    /// Most purchases of one voucher committed in one transaction (group
    /// commit); 1 restores one order per transaction.
    #[arg(long, env = "SECKILL_SALE_BATCH_MAX", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub sale_batch_max: u64,

    /// Most accepted orders an async sale's writer takes from the stream
    /// and commits in one transaction. Larger than group commit's cap: no
    /// buyer waits on this batch, and a backlog drains faster in big ones.
    #[arg(long, env = "SECKILL_ASYNC_BATCH_MAX", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub async_batch_max: u64,

    /// Lease of the per-user purchase lock, in milliseconds.
    #[arg(long = "lock-lease-ms", env = "SECKILL_LOCK_LEASE_MS",
          default_value = "10000", value_name = "MS", value_parser = millis)]
    pub lock_lease: Duration,

    /// Deadline of every Postgres query and Redis command (getting a
    /// connection included), in milliseconds; past it the request answers
    /// 503 and the connection is not reused.
    #[arg(long = "dependency-timeout-ms", env = "SECKILL_DEPENDENCY_TIMEOUT_MS",
          default_value = "2000", value_name = "MS", value_parser = millis)]
    pub dependency_timeout: Duration,

    /// Longest time to read a request's headers, and to wait for the next
    /// request on an idle keep-alive connection, in milliseconds; also the
    /// longest pause while a request's body arrives.
    #[arg(long = "header-timeout-ms", env = "SECKILL_HEADER_TIMEOUT_MS",
          default_value = "10000", value_name = "MS", value_parser = millis)]
    pub header_timeout: Duration,

    /// Most client connections open at once (default: what the process's
    /// open-file limit allows, less room for the pools and the logs).
    #[arg(long, env = "SECKILL_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,

    /// How long a voucher's time window is served from memory, in ms.
    #[arg(long = "voucher-cache-ms", env = "SECKILL_VOUCHER_CACHE_MS",
          default_value = "1000", value_name = "MS", value_parser = millis)]
    pub voucher_cache_ttl: Duration,

    /// At start-up, how long to keep retrying an unreachable Postgres.
    #[arg(long = "startup-wait-ms", env = "SECKILL_STARTUP_WAIT_MS",
          default_value = "30000", value_name = "MS", value_parser = millis)]
    pub startup_wait: Duration,

    /// Serve the lab (LAB.md): `/lab/{strategy}/seckill/{id}` and its
    /// admin routes, which run deliberately flawed strategies on the lab's
    /// own tables. Never on in production.
    #[arg(
        long,
        env = "SECKILL_LAB",
        value_parser = clap::builder::BoolishValueParser::new(),
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true"
    )]
    pub lab: bool,

    /// Lease of the lab's locks, in milliseconds: short, so that a stall
    /// past it is quick to show.
    #[arg(long = "lab-lease-ms", env = "SECKILL_LAB_LEASE_MS",
          default_value = "1000", value_name = "MS", value_parser = millis)]
    pub lab_lease: Duration,

    /// On SIGTERM, how long the drain of in-flight requests and the lock
    /// releases may take together; connections still open then are closed.
    #[arg(long = "shutdown-timeout-ms", env = "SECKILL_SHUTDOWN_TIMEOUT_MS",
          default_value = "10000", value_name = "MS", value_parser = millis)]
    pub shutdown_timeout: Duration,

    /// Fault injection for tests: pretend this host's clock is off by this
    /// many milliseconds (the sale window still follows Redis's clock).
    #[arg(
        long,
        env = "SECKILL_FAULT_CLOCK_SKEW_MS",
        default_value_t = 0,
        allow_negative_numbers = true,
        hide = true
    )]
    pub fault_clock_skew_ms: i64,
}

#[derive(Parser)]
struct Only {
    #[command(flatten)]
    settings: Settings,
}

impl Settings {
    /// Settings from the environment and these flags (`args` excludes the
    /// program name).
    pub fn from_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let argv = std::iter::once(std::ffi::OsString::from("seckill"))
            .chain(args.into_iter().map(Into::into));
        Only::try_parse_from(argv).map(|only| only.settings)
    }

    /// The admin token, if one is set and not empty.
    pub fn admin_token(&self) -> Option<&str> {
        self.admin_token.as_deref().filter(|t| !t.is_empty())
    }

    /// The payment notifications' key, if one is set and not empty.
    pub fn payment_secret(&self) -> Option<&str> {
        self.payment_secret.as_deref().filter(|t| !t.is_empty())
    }

    /// The lock nodes named, without blanks.
    pub fn lock_nodes(&self) -> Vec<&str> {
        self.lock_redis_urls
            .iter()
            .map(|u| u.trim())
            .filter(|u| !u.is_empty())
            .collect()
    }

    pub fn pg_pool_size(&self) -> u32 {
        self.pg_pool.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            u32::try_from(cores * 4).unwrap_or(u32::MAX)
        })
    }

    /// The connection bound: as configured, or what the open-file limit
    /// `nofile` leaves after the pools' connections and a reserve.
    pub fn max_connections(&self, nofile: u64) -> usize {
        self.max_connections.unwrap_or_else(|| {
            let pools = u64::from(self.pg_pool_size())
                // The service's one Redis connection, and per lock client a
                // command and a subscriber connection.
                + 1
                + 2 * u64::try_from(self.lock_nodes().len() + 1).unwrap_or(u64::MAX);
            let left = nofile.saturating_sub(pools + 64);
            usize::try_from(left.clamp(16, 100_000)).unwrap_or(100_000)
        })
    }
}

/// A duration given in whole milliseconds, as every `*_MS` setting is.
fn millis(text: &str) -> Result<Duration, String> {
    text.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|e| format!("{text:?} is not a whole number of milliseconds: {e}"))
}
