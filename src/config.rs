//! Settings: every knob of the service, read from the environment (or a
//! `.env` file, or flags), held in one value that builds the whole app.

use std::net::IpAddr;
use std::time::Duration;

use clap::Parser;
use ipnet::IpNet;
use secrecy::{ExposeSecret, SecretString};

/// What stands between the service and Postgres.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PgPooler {
    /// Postgres itself, or a pooler in session mode.
    None,
    /// A pooler in transaction mode (pgbouncer's common production setup).
    Transaction,
}

/// A feature on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
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

    /// Bearer token for /admin/*; unset, admin routes answer 403. At
    /// least 32 bytes and no placeholder, or the service refuses to start.
    #[arg(long, env = "SECKILL_ADMIN_TOKEN", hide_env_values = true, value_parser = secret)]
    pub admin_token: Option<SecretString>,

    /// Key that signs user tokens; unset, a random one per process (its
    /// tokens fail on every other instance and die with the process).
    #[arg(long, env = "SECKILL_TOKEN_SECRET", hide_env_values = true, value_parser = secret)]
    pub token_secret: Option<SecretString>,

    /// Key of the payment provider's notification signatures (HMAC-SHA256
    /// of the raw body); unset, /payments/notify answers 403.
    #[arg(long, env = "SECKILL_PAYMENT_SECRET", hide_env_values = true, value_parser = secret)]
    pub payment_secret: Option<SecretString>,

    /// Addresses or networks (comma-separated, `10.0.0.0/8` or
    /// `127.0.0.1`) of the proxies whose `X-Forwarded-For` names the client;
    /// its last hop that is not one of them is then the client's address.
    /// Unset: the socket's peer.
    #[arg(long, env = "SECKILL_TRUSTED_PROXIES", value_delimiter = ',', value_parser = proxy_net)]
    pub trusted_proxies: Vec<IpNet>,

    /// Requests per second one client address may send on any route, with
    /// a burst of the same size; 0 turns the limit off. IPv6 clients are
    /// counted by their /64 network.
    #[arg(long, env = "SECKILL_LIMIT_PER_ADDRESS", default_value_t = 200)]
    pub limit_per_address: u32,

    /// Requests per second one user token may send on the purchase, order
    /// and queue routes, with a burst of the same size; 0 turns it off.
    #[arg(long, env = "SECKILL_LIMIT_PER_USER", default_value_t = 5)]
    pub limit_per_user: u32,

    /// How long a rate-limited request's `429` is held before it is sent,
    /// in milliseconds: a script that asks again at once is slowed to one
    /// request per connection and delay; 0 answers at once.
    #[arg(long = "limit-delay-ms", env = "SECKILL_LIMIT_DELAY_MS",
          default_value = "500", value_name = "MS", value_parser = millis)]
    pub limit_delay: Duration,

    /// The queueing delay at which the instance is saturated and sheds
    /// requests, least critical first (anonymous reads, never the probes;
    /// admin at ten times it, orders and payments at 25 times, the sale's
    /// purchases at a hundred times), in milliseconds; each refusal is held
    /// as a rate-limited one is. 0 turns shedding off.
    #[arg(long = "shed-delay-ms", env = "SECKILL_SHED_DELAY_MS",
          default_value = "2", value_name = "MS", value_parser = millis)]
    pub shed_delay: Duration,

    /// Where `/metrics` is served instead of the public address (the
    /// public one then answers 404 for it). Unset: on the public address.
    #[arg(long, env = "SECKILL_METRICS_ADDR")]
    pub metrics_addr: Option<String>,

    /// Independent Redis nodes (comma-separated URLs) for the users'
    /// purchase locks, taken as RedLocks (a majority must grant them).
    /// Unset: the locks live on REDIS_URL.
    #[arg(long, env = "SECKILL_LOCK_REDIS_URLS", value_delimiter = ',')]
    pub lock_redis_urls: Vec<String>,

    /// `off`: a sync purchase takes no per-user lock, and one order per
    /// user rests on the sale statement and its unique index alone. Only
    /// to measure what the lock buys (the guide's "Why the lock").
    #[arg(long, env = "SECKILL_USER_LOCKS", value_enum, default_value_t = Switch::On)]
    pub user_locks: Switch,

    /// Prefix of every Redis key the service writes, to share one Redis.
    #[arg(long, env = "SECKILL_REDIS_PREFIX", default_value = "")]
    pub redis_prefix: String,

    /// Postgres connections of the sale's commits (group commit, the async
    /// writers), default 4 per core. Purchases of one voucher queue for its
    /// row lock anyway; more connections only add waiters that wake and
    /// contend (BENCHMARKS.md shows the curve).
    #[arg(long, env = "SECKILL_PG_POOL",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub pg_pool: Option<u32>,

    /// Postgres connections of everything else (reads, admin, payments,
    /// cancels, expiry, stats, readiness), default 2 per core: a flood of
    /// those waits here, never for the sale's connections.
    #[arg(long, env = "SECKILL_PG_POOL_OTHER",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub pg_pool_other: Option<u32>,

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
          default_value = "10000", value_name = "MS", value_parser = positive_millis)]
    pub lock_lease: Duration,

    /// Deadline of every Postgres query and Redis command (getting a
    /// connection included), in milliseconds; past it the request answers
    /// 503 and the connection is not reused.
    #[arg(long = "dependency-timeout-ms", env = "SECKILL_DEPENDENCY_TIMEOUT_MS",
          default_value = "2000", value_name = "MS", value_parser = millis)]
    pub dependency_timeout: Duration,

    /// Longest time to read a request's headers, to wait for the next
    /// request on an idle keep-alive connection, and to wait for a client
    /// to take any of its answer, in milliseconds.
    #[arg(long = "header-timeout-ms", env = "SECKILL_HEADER_TIMEOUT_MS",
          default_value = "10000", value_name = "MS", value_parser = millis)]
    pub header_timeout: Duration,

    /// Longest time a request's whole body may take to arrive, counted
    /// from its headers, in milliseconds; a slower body is refused and its
    /// connection closed.
    #[arg(long = "body-timeout-ms", env = "SECKILL_BODY_TIMEOUT_MS",
          default_value = "5000", value_name = "MS", value_parser = millis)]
    pub body_timeout: Duration,

    /// Most client connections open at once (default: what the process's
    /// open-file limit allows, less room for the pools and the logs).
    #[arg(long, env = "SECKILL_MAX_CONNECTIONS",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_connections: Option<usize>,

    /// How long a voucher's time window is served from memory, in ms.
    #[arg(long = "voucher-cache-ms", env = "SECKILL_VOUCHER_CACHE_MS",
          default_value = "1000", value_name = "MS", value_parser = millis)]
    pub voucher_cache_ttl: Duration,

    /// At start-up, how long to keep retrying a Postgres that refuses or
    /// does not answer; also the migrations' deadline (at least 10 s),
    /// their wait for another instance's migration lock included.
    #[arg(long = "startup-wait-ms", env = "SECKILL_STARTUP_WAIT_MS",
          default_value = "30000", value_name = "MS", value_parser = millis)]
    pub startup_wait: Duration,

    /// On SIGTERM, how long the drain of in-flight requests and the lock
    /// releases may take together; connections still open then are closed.
    #[arg(long = "shutdown-timeout-ms", env = "SECKILL_SHUTDOWN_TIMEOUT_MS",
          default_value = "10000", value_name = "MS", value_parser = millis)]
    pub shutdown_timeout: Duration,

    /// The shop's JWK Set: a file path, or an `http://`/`https://` URL
    /// (fetched at start-up, every 10 minutes, and on an unknown `kid`, at
    /// most once per 5 s). Its RS256, ES256 and EdDSA keys verify JWTs.
    #[arg(long, env = "SECKILL_JWT_JWKS")]
    pub jwt_jwks: Option<String>,

    /// A shared HS256 key for the shop's JWTs (at least 32 bytes, no
    /// placeholder).
    #[arg(long, env = "SECKILL_JWT_HS256_SECRET", hide_env_values = true, value_parser = secret)]
    pub jwt_hs256_secret: Option<SecretString>,

    /// The exact `iss` a JWT must carry; required when a JWT key is set.
    #[arg(long, env = "SECKILL_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// An `aud` a JWT must carry (its `aud`, a string or a list, must
    /// contain it); required when a JWT key is set.
    #[arg(long, env = "SECKILL_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// Clock leeway for a JWT's `exp` and `nbf`, in seconds.
    #[arg(long, env = "SECKILL_JWT_LEEWAY_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub jwt_leeway_seconds: u64,

    /// Where the order events are POSTed (`http://` or `https://`); unset,
    /// they are only read from `GET /admin/events`.
    #[arg(long, env = "SECKILL_WEBHOOK_URL")]
    pub webhook_url: Option<String>,

    /// Key of the webhooks' signatures (HMAC-SHA256); required with the URL.
    #[arg(long, env = "SECKILL_WEBHOOK_SECRET", hide_env_values = true, value_parser = secret)]
    pub webhook_secret: Option<SecretString>,

    /// Most events in one webhook delivery.
    #[arg(long, env = "SECKILL_WEBHOOK_BATCH", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub webhook_batch: u32,

    /// How long the receiver has to answer a delivery, in milliseconds (1
    /// to 60000).
    #[arg(long = "webhook-timeout-ms", env = "SECKILL_WEBHOOK_TIMEOUT_MS",
          default_value = "5000", value_name = "MS", value_parser = delivery_timeout)]
    pub webhook_timeout: Duration,

    /// How long an event's delivery is retried before it is failed, in
    /// seconds (at least a day in production; tests shorten it).
    #[arg(long, env = "SECKILL_WEBHOOK_RETRY_SECONDS", default_value_t = 86_400,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub webhook_retry_seconds: u64,

    /// Acknowledged order events older than this many days are deleted
    /// (without webhooks, every event that old).
    #[arg(long, env = "SECKILL_EVENT_RETENTION_DAYS", default_value_t = 7,
          value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub event_retention_days: u32,

    /// The demo: a voucher on sale, the secrets made up where none are set,
    /// and the demo's routes (`/demo/users` hands out users,
    /// `/demo/orders/{order_id}/pay` pays as the demo payment provider);
    /// without it those routes answer `404`.
    #[arg(long)]
    pub demo: bool,

    /// Fault injection for tests: pretend this host's clock is off by this
    /// many milliseconds (the sale window still follows Redis's clock).
    #[arg(
        long,
        env = "SECKILL_FAULT_CLOCK_SKEW_MS",
        default_value_t = 0,
        allow_negative_numbers = true,
        hide = true,
        value_parser = clap::value_parser!(i64).range(-MOST_SKEW_MS..=MOST_SKEW_MS)
    )]
    pub fault_clock_skew_ms: i64,
}

#[derive(Parser)]
struct Only {
    #[command(flatten)]
    settings: Settings,
}

/// A getter per optional text setting, `None` where it is unset: a plain
/// one trimmed (`non_blank`: blank counts as unset), a secret as given
/// (`exposed`: empty counts as unset).
macro_rules! optional_text {
    ($($(#[$doc:meta])* $name:ident: $read:ident;)+) => {$(
        $(#[$doc])*
        pub fn $name(&self) -> Option<&str> {
            $read(self.$name.as_ref())
        }
    )+};
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

    /// Settings that can be used as they are: every secret that is set is
    /// long enough and no placeholder (the error names the variable).
    pub fn check(&self) -> Result<(), SettingsError> {
        for (variable, value) in [
            ("SECKILL_ADMIN_TOKEN", &self.admin_token),
            ("SECKILL_TOKEN_SECRET", &self.token_secret),
            ("SECKILL_PAYMENT_SECRET", &self.payment_secret),
            ("SECKILL_JWT_HS256_SECRET", &self.jwt_hs256_secret),
            ("SECKILL_WEBHOOK_SECRET", &self.webhook_secret),
        ] {
            if let Some(value) = exposed(value.as_ref()) {
                weak_secret(value).map_or(Ok(()), |why| {
                    Err(SettingsError::WeakSecret { variable, why })
                })?;
            }
        }
        self.check_database_urls()?;
        self.check_jwt()?;
        self.check_webhook()
    }

    /// The Postgres URLs read as Postgres connection URLs: a malformed one
    /// stops the start naming its variable, not as Postgres failing.
    fn check_database_urls(&self) -> Result<(), SettingsError> {
        let urls = [
            ("DATABASE_URL", Some(&self.database_url)),
            (
                "SECKILL_DATABASE_DIRECT_URL",
                self.database_direct_url.as_ref(),
            ),
        ];
        for (variable, url) in urls {
            // An empty direct URL is none (DATABASE_URL serves).
            if let Some(url) = url.filter(|url| !url.trim().is_empty()) {
                let why = if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                    Some("its scheme is not postgres:// or postgresql://".to_owned())
                } else {
                    url.parse::<sqlx::postgres::PgConnectOptions>()
                        .err()
                        .map(|error| error.to_string())
                };
                if let Some(why) = why {
                    return Err(SettingsError::NotPostgres { variable, why });
                }
            }
        }
        Ok(())
    }

    /// A JWT key needs the issuer and the audience it is for: without
    /// them, any token the key ever signed (for another service too) would
    /// sign a buyer in.
    fn check_jwt(&self) -> Result<(), SettingsError> {
        if self.jwt_jwks().is_none() && self.jwt_hs256_secret().is_none() {
            return Ok(());
        }
        for (variable, value) in [
            ("SECKILL_JWT_ISSUER", self.jwt_issuer()),
            ("SECKILL_JWT_AUDIENCE", self.jwt_audience()),
        ] {
            if value.is_none() {
                return Err(SettingsError::Missing {
                    variable,
                    because: "a JWT key is set (SECKILL_JWT_JWKS or SECKILL_JWT_HS256_SECRET)",
                });
            }
        }
        Ok(())
    }

    fn check_webhook(&self) -> Result<(), SettingsError> {
        let Some(url) = self.webhook_url() else {
            return Ok(());
        };
        let parsed = reqwest::Url::parse(url).ok();
        if !parsed
            .as_ref()
            .is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
        {
            return Err(SettingsError::NotHttp {
                variable: "SECKILL_WEBHOOK_URL",
            });
        }
        if self.webhook_secret().is_none() {
            return Err(SettingsError::Missing {
                variable: "SECKILL_WEBHOOK_SECRET",
                because: "SECKILL_WEBHOOK_URL is set",
            });
        }
        Ok(())
    }

    optional_text! {
        /// The JWK Set's path or URL.
        jwt_jwks: non_blank;
        /// The `iss` a JWT must carry.
        jwt_issuer: non_blank;
        /// The `aud` a JWT must carry.
        jwt_audience: non_blank;
        /// The shared HS256 key of the shop's JWTs.
        jwt_hs256_secret: exposed;
        /// The webhooks' URL.
        webhook_url: non_blank;
        /// The webhooks' signing key.
        webhook_secret: exposed;
        /// The admin token.
        admin_token: exposed;
        /// The user tokens' key.
        token_secret: exposed;
        /// The payment notifications' key.
        payment_secret: exposed;
    }

    /// The lock nodes named, without blanks.
    pub fn lock_nodes(&self) -> Vec<&str> {
        self.lock_redis_urls
            .iter()
            .map(|u| u.trim())
            .filter(|u| !u.is_empty())
            .collect()
    }

    /// Connections of the sale's pool.
    pub fn pg_pool_size(&self) -> u32 {
        self.pg_pool.unwrap_or_else(|| per_core(4))
    }

    /// Connections of the pool of everything but the sale's commits.
    pub fn pg_pool_other_size(&self) -> u32 {
        self.pg_pool_other.unwrap_or_else(|| per_core(2))
    }

    /// The connection bound: as configured, or what the open-file limit
    /// `nofile` leaves after the pools' connections and a reserve.
    pub fn max_connections(&self, nofile: u64) -> usize {
        self.max_connections.unwrap_or_else(|| {
            let pools = u64::from(self.pg_pool_size())
                + u64::from(self.pg_pool_other_size())
                // The service's one Redis connection, and per lock client a
                // command and a subscriber connection.
                + 1
                + 2 * u64::try_from(self.lock_nodes().len() + 1).unwrap_or(u64::MAX);
            let left = nofile.saturating_sub(pools + 64);
            usize::try_from(left.clamp(16, 100_000)).unwrap_or(100_000)
        })
    }
}

/// `n` per core of this machine.
fn per_core(n: usize) -> u32 {
    let cores = std::thread::available_parallelism().map_or(2, |c| c.get());
    u32::try_from(cores * n).unwrap_or(u32::MAX)
}

/// Settings that parse but cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{variable} {why}: set a random value of at least {MIN_SECRET_BYTES} bytes (for example `openssl rand -hex 32`), or unset it")]
    WeakSecret {
        variable: &'static str,
        why: &'static str,
    },
    #[error("{variable} must be set because {because}")]
    Missing {
        variable: &'static str,
        because: &'static str,
    },
    #[error("{variable} must be an http:// or https:// URL with a host")]
    NotHttp { variable: &'static str },
    #[error("{variable} is not a Postgres URL (postgres://user@host:port/database): {why}")]
    NotPostgres { variable: &'static str, why: String },
}

/// Fewest bytes of a secret: 256 bits of hex or base64 take more.
pub const MIN_SECRET_BYTES: usize = 32;

/// What placeholders and example values hold: a secret with one of these
/// in it was copied from a file, not made.
const PLACEHOLDERS: &[&str] = &[
    "changeme",
    "replaceme",
    "placeholder",
    "example",
    "password",
    "yoursecret",
    "secretkey",
    "mysecret",
    "insecure",
    "notsecret",
    "xxxxxxxx",
    "12345678",
];

/// Why `value` is not a usable secret, if it is not.
pub fn weak_secret(value: &str) -> Option<&'static str> {
    if value.len() < MIN_SECRET_BYTES {
        return Some("is shorter than 32 bytes");
    }
    let letters: String = value
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if PLACEHOLDERS.iter().any(|p| letters.contains(p)) {
        return Some("is a placeholder");
    }
    // "aaaa...", "secretsecretsecret...": too few distinct bytes to be random.
    let mut seen = [false; 256];
    value.bytes().for_each(|b| seen[usize::from(b)] = true);
    if seen.iter().filter(|s| **s).count() < 8 {
        return Some("repeats too few characters to be random");
    }
    None
}

fn exposed(secret: Option<&SecretString>) -> Option<&str> {
    secret
        .map(ExposeSecret::expose_secret)
        .filter(|s| !s.is_empty())
}

/// A setting's text without its surrounding blanks, if any is left.
fn non_blank(text: Option<&String>) -> Option<&str> {
    text.map(|t| t.trim()).filter(|s| !s.is_empty())
}

/// A setting's value that does not parse (clap shows its message).
#[derive(Debug, thiserror::Error)]
enum BadValue {
    #[error("{0:?} is neither an IP address nor a network such as 10.0.0.0/8")]
    NotANetwork(String),
    #[error("{text:?} is not a whole number of milliseconds: {cause}")]
    NotMillis {
        text: String,
        cause: std::num::ParseIntError,
    },
    #[error("{0} ms is not within 1 to 60000 ms")]
    DeliveryTimeoutOutOfRange(u128),
    #[error("{0} ms is more than a day ({MOST_MILLIS} ms), the most any `*_MS` setting takes")]
    MillisTooLong(u64),
    #[error("0 ms: this setting takes 1 ms at least")]
    ZeroMillis,
}

/// A secret as given; empty counts as unset.
fn secret(text: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(SecretString::from(text.to_owned()))
}

/// A trusted proxy: an address (one host) or a network.
fn proxy_net(text: &str) -> Result<IpNet, BadValue> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| BadValue::NotANetwork(text.to_owned()))
}

/// A webhook delivery's timeout: at least 1 ms (with 0 none would ever
/// arrive), at most a minute (retries start at most 10 minutes apart,
/// counted from the start of the attempt before).
fn delivery_timeout(text: &str) -> Result<Duration, BadValue> {
    let timeout = millis(text)?;
    if (1..=60_000).contains(&timeout.as_millis()) {
        Ok(timeout)
    } else {
        Err(BadValue::DeliveryTimeoutOutOfRange(timeout.as_millis()))
    }
}

/// The most the injected clock fault may be, either way: a day.
const MOST_SKEW_MS: i64 = 86_400_000;

/// The longest any `*_MS` setting may be: a day (twice the dependency
/// deadline must still fit Postgres's `statement_timeout`, and the caches
/// their timers).
const MOST_MILLIS: u64 = 86_400_000;

/// A duration given in whole milliseconds, as every `*_MS` setting is, of
/// a day at most.
fn millis(text: &str) -> Result<Duration, BadValue> {
    let ms = text.parse::<u64>().map_err(|cause| BadValue::NotMillis {
        text: text.to_owned(),
        cause,
    })?;
    if ms > MOST_MILLIS {
        return Err(BadValue::MillisTooLong(ms));
    }
    Ok(Duration::from_millis(ms))
}

/// Like [`millis`], for a setting that 0 would break (a lease of nothing).
fn positive_millis(text: &str) -> Result<Duration, BadValue> {
    let duration = millis(text)?;
    if duration.is_zero() {
        return Err(BadValue::ZeroMillis);
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_millisecond_setting_is_a_day_at_most_and_a_lease_one_millisecond_at_least() {
        assert_eq!(millis("0").unwrap(), Duration::ZERO);
        assert_eq!(millis("86400000").unwrap(), Duration::from_secs(86_400));
        assert!(millis("86400001").is_err());
        assert!(millis("18446744073709551615").is_err());
        assert!(positive_millis("0").is_err());
        assert_eq!(positive_millis("1").unwrap(), Duration::from_millis(1));
    }

    #[test]
    fn a_webhook_delivery_timeout_is_one_millisecond_to_a_minute() {
        // 0 timed every delivery out; a huge one overflowed the lease.
        assert!(delivery_timeout("0").is_err());
        assert!(delivery_timeout("60001").is_err());
        assert!(delivery_timeout("18446744073709551615").is_err());
        assert_eq!(delivery_timeout("1").unwrap(), Duration::from_millis(1));
        assert_eq!(delivery_timeout("5000").unwrap(), Duration::from_secs(5));
        assert_eq!(delivery_timeout("60000").unwrap(), Duration::from_secs(60));
    }
}
