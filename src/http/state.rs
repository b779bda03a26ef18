//! What every handler can reach: the service, sign-in, events, limits and
//! the shedder, as one shared value. A leaf of `http`: the routes and the
//! middleware import it, it imports none of them but the types it holds.

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;

use super::extract::{AdminToken, SignIn};
use super::limit::Limits;
use super::shed;
use super::tally::Monitor;
use crate::auth::Authenticator;
use crate::events::Events;
use crate::seckill::Seckill;

/// What every handler can reach: one shared value, so that the copy axum
/// hands each request is one reference count, not a clone of every part
/// (the token key alone was an allocation and a free per request).
#[derive(Clone)]
pub struct AppState(Arc<AppParts>);

impl AppState {
    pub fn new(parts: AppParts) -> Self {
        Self(Arc::new(parts))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppParts;

    fn deref(&self) -> &AppParts {
        &self.0
    }
}

/// The parts of [`AppState`].
pub struct AppParts {
    pub seckill: Seckill,
    /// Verifies user tokens: the service's own, and the shop's JWTs.
    pub auth: Authenticator,
    /// The order events' feed and failed deliveries.
    pub events: Events,
    /// `None`: no admin token configured, admin routes answer 403.
    pub admin_token: Option<AdminToken>,
    /// `None`: no payment secret configured, `/payments/notify` answers 403.
    pub payment_secret: Option<Arc<[u8]>>,
    pub metrics: PrometheusHandle,
    /// The rate limits per client address and per user.
    pub limits: Limits,
    /// Refuses the least critical requests first when saturated.
    pub shedder: shed::Shedder,
    /// `/metrics` is served on the public address (no
    /// `SECKILL_METRICS_ADDR`).
    pub public_metrics: bool,
    /// `serve --demo`: the `/demo/*` routes answer.
    pub demo: bool,
    /// Every purchase answer per voucher, for the sale monitor.
    pub monitor: Monitor,
    /// `GET /vouchers`' list as last rendered.
    pub listing: super::cache::Listing,
    /// `/metrics`' text as last rendered.
    pub metrics_page: super::cache::MetricsPage,
}

impl SignIn for AppState {
    fn admin_token(&self) -> Option<&AdminToken> {
        self.admin_token.as_ref()
    }

    fn authenticator(&self) -> &Authenticator {
        &self.auth
    }
}

impl AsRef<Limits> for AppState {
    fn as_ref(&self) -> &Limits {
        &self.limits
    }
}

impl AsRef<Monitor> for AppState {
    fn as_ref(&self) -> &Monitor {
        &self.monitor
    }
}

impl AsRef<shed::Shedder> for AppState {
    fn as_ref(&self) -> &shed::Shedder {
        &self.shedder
    }
}
