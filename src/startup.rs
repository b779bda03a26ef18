//! Builds the application from one [`Settings`] value: pools, migrations,
//! the service, the router and the listener. No globals but the metrics
//! recorder, so tests can build many apps on port 0 in one process.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use chrono::TimeDelta;
use futures_util::future::BoxFuture;
use tokio::net::TcpListener;

use crate::auth::{Authenticator, JwtSettings, Source};
use crate::config::{PgPooler, Settings, SettingsError, Switch};
use crate::events::{Events, WebhookSettings};
use crate::http::serve::{serve, DrainOutcome, ServeSettings};
use crate::http::shed::Shedder;
use crate::http::starting::Starting;
use crate::http::{self, AdminToken, AppParts, AppState, Limits, RouteClass};
use crate::kv::{Kv, RedisTarget};
use crate::seckill::{LockBackend, SaleClock, Seckill, SeckillSettings};
use crate::store::{PoolSettings, Store, StoreError};
use crate::telemetry::Chain;
use crate::token::TokenSigner;
use redis_locks::{LockClient, LockOptions, MultiNodeLocks, Quorum};

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error("Postgres at start-up")]
    Store(#[from] StoreError),
    #[error("{variable} cannot be connected to")]
    RedisUrl {
        /// The setting that named the Redis.
        variable: &'static str,
        source: redis::RedisError,
    },
    #[error("{variable}")]
    RedisTarget {
        variable: &'static str,
        source: crate::kv::BadRedisUrl,
    },
    #[error("SECKILL_JWT_JWKS")]
    Jwks(#[from] crate::auth::JwksError),
    #[error("{variable}: cannot listen on {addr}: {source}")]
    Bind {
        /// The setting that named the address.
        variable: &'static str,
        addr: String,
        source: std::io::Error,
    },
}

/// Routes served beside the service's own, and what stops with them: how
/// a crate built on the service (the lab) mounts itself on an
/// [`Application`].
pub struct Mount {
    /// Its routes, behind the service's middleware (limits, shedding,
    /// deadlines, traces); their handlers see the service's [`AppState`].
    pub routes: Router<AppState>,
    /// The class of each of its paths (as `routes` declares them): which
    /// limits cover it, how critical it is when the instance sheds load.
    pub classes: Vec<(String, RouteClass)>,
    /// Stops what it runs, within the time it is given, once the service's
    /// own workers have stopped; `false` when something was still under
    /// way.
    pub stop: Box<dyn FnOnce(Duration) -> BoxFuture<'static, bool> + Send>,
}

/// A built, listening, not yet serving application.
pub struct Application {
    listener: TcpListener,
    /// `SECKILL_METRICS_ADDR`'s listener, when it is set.
    metrics_listener: Option<TcpListener>,
    state: AppState,
    settings: Settings,
    serve: ServeSettings,
    /// What a crate built on the service may reach: Postgres, Redis, and
    /// the prefix of this database's Redis keys.
    store: Store,
    kv: Kv,
    prefix: String,
    mounted: Option<Mount>,
}

impl Application {
    pub async fn build(settings: Settings) -> Result<Self, StartupError> {
        settings.check()?;
        // Before anything records: a metric set before the recorder is
        // installed is lost (the clock's first offset was).
        let metrics = http::ops::prometheus();
        // The address first: while Postgres is waited for, `/healthz` says
        // the process runs and the rest is `503` (a port taken fails now).
        let starting = Starting::serve(
            bind("SECKILL_ADDR", &settings.addr).await?,
            settings.header_timeout,
        );
        // Its own address too, before Postgres is waited for: a wrong one
        // fails now, not after the wait.
        let metrics_listener = match &settings.metrics_addr {
            Some(addr) => Some(bind("SECKILL_METRICS_ADDR", addr).await?),
            None => None,
        };
        let (store, namespace) = connect_store(&settings).await?;
        // Every key under the database's own namespace: Redis state of
        // another database (or of this one before a reset) is never read.
        let prefix = format!("{}{}:", settings.redis_prefix, namespace.simple());
        let redis = kv(&settings)?;
        let locks = user_locks(&settings, &prefix)?;
        let clock = SaleClock::start(
            redis.clone(),
            TimeDelta::milliseconds(settings.fault_clock_skew_ms),
        );
        if let Err(error) = clock.sync().await {
            tracing::warn!(%error, "cannot read Redis's clock yet; using this host's until it answers");
        }

        let token_key = token_key(&settings);
        let auth = authenticator(&settings, TokenSigner::new(&token_key), &store).await?;
        let events = Events::new(
            store.clone(),
            webhook(&settings),
            settings.event_retention_days,
        );
        let seckill = Seckill::new(
            store.clone(),
            redis.clone(),
            locks,
            clock,
            seckill_settings(&settings, prefix.clone(), &token_key),
        );
        let state = AppState::new(AppParts {
            seckill,
            auth,
            events,
            admin_token: settings.admin_token().map(AdminToken::new),
            payment_secret: settings.payment_secret().map(|s| Arc::from(s.as_bytes())),
            metrics,
            limits: Limits::new(
                settings.limit_per_address,
                settings.limit_per_user,
                settings.trusted_proxies.clone(),
            )
            .delaying_refusals(settings.limit_delay),
            shedder: Shedder::new(settings.shed_delay, settings.limit_delay),
            public_metrics: metrics_listener.is_none(),
            demo: settings.demo,
            monitor: Default::default(),
            listing: Default::default(),
            metrics_page: Default::default(),
        });
        let listener = starting.stop().await.map_err(|source| StartupError::Bind {
            variable: "SECKILL_ADDR",
            addr: settings.addr.clone(),
            source,
        })?;
        // Once the address is ours: an instance that cannot serve (its port
        // taken) starts no expiry, relay or writers to compete with the one
        // that can.
        state.seckill.start_workers();
        let events = state.events.clone();
        state.seckill.spawn_background(|stop| events.tasks(stop));
        let serve = ServeSettings {
            header_timeout: settings.header_timeout,
            max_connections: settings.max_connections(open_file_limit()),
        };
        Ok(Self {
            listener,
            metrics_listener,
            state,
            settings,
            serve,
            store,
            kv: redis,
            prefix,
            mounted: None,
        })
    }

    /// Serves `mount`'s routes beside the service's own (one mount; a
    /// second replaces the first).
    pub fn mount(&mut self, mount: Mount) {
        self.mounted = Some(mount);
    }

    /// The service's Postgres, for a mount that keeps tables of its own.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The service's Redis, each command under the dependency deadline.
    pub fn kv(&self) -> &Kv {
        &self.kv
    }

    /// The prefix of every Redis key this database's instances write: a
    /// mount's keys go under it too, so that they belong to the database.
    pub fn redis_prefix(&self) -> &str {
        &self.prefix
    }

    /// A lock client on the service's Redis, its keys under
    /// [`Self::redis_prefix`] and then `prefix`, its commands bounded by the
    /// dependency deadline.
    pub fn lock_client(&self, prefix: &str) -> Result<LockClient, StartupError> {
        lock_client(
            &self.settings,
            "REDIS_URL",
            &self.settings.redis_url,
            &format!("{}{prefix}", self.prefix),
        )
    }

    /// Where `/metrics` is served apart, if it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn seckill(&self) -> &Seckill {
        &self.state.seckill
    }

    pub fn tokens(&self) -> &TokenSigner {
        self.state.auth.v1()
    }

    /// Serves until `shutdown` completes, then drains in-flight requests
    /// and waits for the lock releases they started: both together within
    /// the shutdown timeout, whatever clients do.
    pub async fn run_until(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let Self {
            listener,
            metrics_listener,
            state,
            settings,
            serve: serve_settings,
            mounted,
            ..
        } = self;
        let (mounted_routes, mounted_stop) = match mounted {
            Some(Mount {
                routes,
                classes,
                stop,
            }) => (Some((routes, classes)), Some(stop)),
            None => (None, None),
        };
        // Ends with the public server (its sender dropped below).
        let (metrics_stop, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
        if let Some(metrics_listener) = metrics_listener {
            let router = http::metrics_router(state.clone());
            tokio::spawn(async move {
                let stopped = async {
                    let _ = metrics_stopped.await;
                };
                if let Err(error) = axum::serve(metrics_listener, router)
                    .with_graceful_shutdown(stopped)
                    .await
                {
                    tracing::error!(error = %Chain(&error), "the metrics address stopped serving");
                }
            });
        }
        let seckill = state.seckill.clone();
        tracing::info!(
            addr = %listener.local_addr()?,
            max_connections = serve_settings.max_connections,
            "serving"
        );
        let timeout = settings.shutdown_timeout;
        // The drain may take the timeout less a fifth (at most a second),
        // kept for the workers and the lock releases after it: the whole
        // shutdown ends within the timeout, whatever clients do.
        let reserve = (timeout / 5).min(Duration::from_secs(1));
        let (began, drained) = serve(
            listener,
            http::router(state, settings.body_timeout, mounted_routes),
            serve_settings,
            shutdown,
            timeout - reserve,
        )
        .await;
        drop(metrics_stop);
        if let DrainOutcome::CutOff { left } = drained {
            tracing::warn!(
                left,
                "closed connections still open at the shutdown deadline"
            );
        }
        // The background workers, then the lock releases of requests cut
        // off above (they release as they drop), get what is left of the
        // deadline: the reserve at least, unless the drain overran it.
        let left = || (began + timeout).saturating_duration_since(tokio::time::Instant::now());
        if !seckill.stop_workers(left()).await {
            tracing::warn!(
                running = seckill.workers_running(),
                "background workers still running at the shutdown deadline"
            );
        }
        let left = left();
        let released = seckill.shutdown_locks(left).await;
        let released = released
            & match mounted_stop {
                Some(stop) => stop(left).await,
                None => true,
            };
        if !released {
            tracing::warn!("some lock releases did not finish; their leases will free them");
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// A listener on `addr`, which the setting `variable` names.
async fn bind(variable: &'static str, addr: &str) -> Result<TcpListener, StartupError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartupError::Bind {
            variable,
            addr: addr.to_owned(),
            source,
        })
}

/// The endpoint `url` names, given by the setting `variable`.
fn redis_endpoint(
    variable: &'static str,
    url: &str,
) -> Result<redis_locks::Endpoint, StartupError> {
    RedisTarget::parse(url)
        .map_err(|source| StartupError::RedisTarget { variable, source })?
        .endpoint()
        .map_err(|source| StartupError::RedisUrl { variable, source })
}

/// A lock client on the Redis at `url` (which the setting `variable`
/// names), its keys under `prefix`, its commands bounded by the dependency
/// timeout.
fn lock_client(
    settings: &Settings,
    variable: &'static str,
    url: &str,
    prefix: &str,
) -> Result<LockClient, StartupError> {
    let options = LockOptions {
        command_timeout: settings.dependency_timeout,
        ..LockOptions::default()
    };
    Ok(LockClient::with_options(
        redis_endpoint(variable, url)?,
        prefix,
        options,
    ))
}

/// The user tokens' key, and the waiting-room tickets' derived from it:
/// instances that share one accept each other's tickets.
fn token_key(settings: &Settings) -> Vec<u8> {
    match settings.token_secret() {
        Some(secret) => secret.as_bytes().to_vec(),
        None => {
            tracing::warn!(
                "SECKILL_TOKEN_SECRET is unset: this instance signs user tokens and queue tickets \
                 with a random key of its own, so they fail on every other instance (behind a \
                 balancer, a buyer's next request is 401) and all of them die when it restarts"
            );
            rand::random::<[u8; 32]>().to_vec()
        }
    }
}

/// Who a bearer token signs in: `v1` tokens always, the shop's JWTs when a
/// JWT key is configured (`check` made sure the issuer and audience are).
async fn authenticator(
    settings: &Settings,
    v1: TokenSigner,
    store: &Store,
) -> Result<Authenticator, StartupError> {
    let jwks = settings.jwt_jwks().map(Source::parse).transpose()?;
    let hs256_secret = settings.jwt_hs256_secret().map(|s| s.as_bytes().to_vec());
    if jwks.is_none() && hs256_secret.is_none() {
        return Ok(Authenticator::v1_only(v1));
    }
    let jwt = JwtSettings {
        issuer: settings.jwt_issuer().unwrap_or_default().to_owned(),
        audience: settings.jwt_audience().unwrap_or_default().to_owned(),
        leeway_seconds: settings.jwt_leeway_seconds,
        hs256_secret,
        jwks,
    };
    tracing::info!(issuer = %jwt.issuer, audience = %jwt.audience, "the shop's JWTs sign buyers in");
    Ok(Authenticator::with_jwt(v1, jwt, store.clone()).await?)
}

/// Where the order events are pushed, if anywhere (`check` made sure the
/// URL parses and the secret is set).
fn webhook(settings: &Settings) -> Option<WebhookSettings> {
    let url = reqwest::Url::parse(settings.webhook_url()?).ok()?;
    tracing::info!(
        host = url.host_str().unwrap_or(""),
        "order events are delivered by webhook"
    );
    Some(WebhookSettings {
        url,
        secret: settings.webhook_secret()?.as_bytes().to_vec(),
        batch: settings.webhook_batch,
        timeout: settings.webhook_timeout,
        retry_for: Duration::from_secs(settings.webhook_retry_seconds),
    })
}

/// The sale's tuning, from the settings; its keys under `prefix`.
fn seckill_settings(settings: &Settings, prefix: String, token_key: &[u8]) -> SeckillSettings {
    SeckillSettings {
        redis_prefix: prefix,
        lock_lease: settings.lock_lease,
        voucher_cache_ttl: settings.voucher_cache_ttl,
        sale_batch_max: usize::try_from(settings.sale_batch_max).unwrap_or(1),
        async_batch_max: usize::try_from(settings.async_batch_max).unwrap_or(1),
        async_claim_idle: (settings.dependency_timeout * 3).max(Duration::from_secs(5)),
        // Shorter than the request's deadline: a purchase that waited this
        // long still has time for its lock and its batch.
        gate_wait: settings.dependency_timeout / 2,
        request_deadline: settings.dependency_timeout,
        ticket_key: crate::seckill::ticket_key(token_key),
    }
}

/// The users' purchase locks: on the service's Redis, or RedLock over the
/// nodes of `SECKILL_LOCK_REDIS_URLS`; their keys under `prefix`.
fn user_locks(settings: &Settings, prefix: &str) -> Result<LockBackend, StartupError> {
    if settings.user_locks == Switch::Off {
        tracing::warn!(
            "SECKILL_USER_LOCKS=off: purchases take no per-user lock (for measuring what it buys)"
        );
        return Ok(LockBackend::Off);
    }
    let nodes = settings.lock_nodes();
    if nodes.is_empty() {
        return Ok(LockBackend::Single(lock_client(
            settings,
            "REDIS_URL",
            &settings.redis_url,
            prefix,
        )?));
    }
    let clients = nodes
        .into_iter()
        .map(|url| lock_client(settings, "SECKILL_LOCK_REDIS_URLS", url, prefix))
        .collect::<Result<Vec<_>, _>>()?;
    tracing::info!(
        nodes = clients.len(),
        "users' locks are RedLocks over independent Redis nodes"
    );
    Ok(LockBackend::RedLock {
        locks: MultiNodeLocks::new(clients, Quorum::Majority),
        node_timeout: settings.dependency_timeout.min(Duration::from_millis(500)),
    })
}

/// The service's own Redis commands, on the Redis `REDIS_URL` names.
fn kv(settings: &Settings) -> Result<Kv, StartupError> {
    Ok(Kv::new(
        redis_endpoint("REDIS_URL", &settings.redis_url)?,
        settings.dependency_timeout,
    ))
}

/// Connects to Postgres, retrying while it is unreachable (it may still be
/// starting next to us) for at most the configured start-up wait.
/// The migrations' deadline is the start-up wait, but never less than this
/// (a start-up wait of 0 means "do not wait for Postgres", not "do not
/// migrate").
const MIGRATIONS_AT_LEAST: std::time::Duration = std::time::Duration::from_secs(10);

/// The pools' sizes, deadline and way to Postgres, from the settings.
pub fn pool_settings(settings: &Settings) -> PoolSettings {
    PoolSettings {
        max_connections: settings.pg_pool_size(),
        other_connections: settings.pg_pool_other_size(),
        timeout: settings.dependency_timeout,
        transaction_pooler: settings.pg_pooler == PgPooler::Transaction,
        direct_url: settings
            .database_direct_url
            .clone()
            .filter(|url| !url.trim().is_empty()),
        migrations_deadline: settings.startup_wait.max(MIGRATIONS_AT_LEAST),
    }
}

/// The store, and the database's namespace read through it.
async fn connect_store(settings: &Settings) -> Result<(Store, uuid::Uuid), StoreError> {
    let pool = pool_settings(settings);
    let started = Instant::now();
    loop {
        let connected = async {
            let store = Store::connect(&settings.database_url, &pool).await?;
            let namespace = store.namespace().await?;
            Ok((store, namespace))
        };
        match connected.await {
            // Refused, or accepted and not answered in time (starting, or
            // frozen): tried again until the start-up wait is spent.
            Err(error @ (StoreError::Unavailable(_) | StoreError::TimedOut(_)))
                if started.elapsed() < settings.startup_wait =>
            {
                tracing::warn!(%error, "Postgres is not reachable yet; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            other => return other,
        }
    }
}

/// The process's open-file limit, raised first to the hard limit: every
/// client connection costs a descriptor.
fn open_file_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(error) => {
            tracing::warn!(%error, "cannot read the open-file limit; assuming 1024");
            1024
        }
    }
}
