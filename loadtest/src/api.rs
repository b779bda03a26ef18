//! The admin side of the API that the driver needs: vouchers, tokens,
//! stats and order listings, and the lab's vouchers and stats.

use std::sync::Arc;

use anyhow::Context;
use chrono::Utc;

use serde_json::{json, Value};

use crate::service::Target;

/// How a voucher sells (the contract's `sale_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaleMode {
    /// The order is in Postgres when the buyer hears `200`.
    Sync,
    /// Redis accepts (`202 pending`); the stream writers store it.
    Async,
}

impl SaleMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Async => "async",
        }
    }
}

pub use testkit::{OrderLine, Stats};

/// The admin API of one instance of a run's target: testkit's client,
/// patient with the refusals of a service whose limits are on, and the
/// lab's routes.
pub struct Admin {
    api: testkit::AdminApi,
}

/// A voucher to create.
#[derive(Debug, Clone, Copy)]
pub struct NewSale {
    pub mode: SaleMode,
    pub stock: i64,
    /// On sale from a minute ago for this long.
    pub hours: i64,
    pub price_cents: i64,
    pub pay_within_seconds: i64,
    /// Most units one order may take.
    pub max_units_per_user: i64,
}

impl NewSale {
    /// Free units with the default payment window (15 minutes).
    pub fn free(mode: SaleMode, stock: i64, hours: i64) -> Self {
        Self {
            mode,
            stock,
            hours,
            price_cents: 0,
            pay_within_seconds: 900,
            max_units_per_user: 1,
        }
    }

    /// The same sale, allowing up to `units` units per order.
    pub fn allowing(self, units: i64) -> Self {
        Self {
            max_units_per_user: units,
            ..self
        }
    }
}

/// What a lab voucher's rows say.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
pub struct LabStats {
    pub initial_stock: i64,
    pub stock: i64,
    pub orders: i64,
    pub distinct_users: i64,
    pub foreign_releases: i64,
    /// The lab voucher's stock in Redis (the Redis-stock designs).
    #[serde(default)]
    pub redis_stock: Option<i64>,
}

impl Admin {
    pub fn new(target: &Target) -> Self {
        Self::on(target, 0)
    }

    /// The admin API of instance `i` (counted round the instances).
    pub fn on(target: &Target, i: usize) -> Self {
        let base = target
            .bases
            .get(i % target.bases.len().max(1))
            .unwrap_or(&target.base);
        // With the service's limits on (`loadtest abuse`), the admin's
        // calls share the driver's address with the connections it opens
        // before a run, and a saturated instance sheds the admin's calls
        // first: a refusal says when to come back.
        let api = testkit::AdminApi::new(base.as_str(), target.admin_token.as_str()).patient(30);
        Self { api }
    }

    /// A voucher of `mode` whose stock cannot run out, on sale for two
    /// hours.
    pub async fn endless_voucher(&self, mode: SaleMode) -> anyhow::Result<i64> {
        self.create_voucher(mode, i64::from(i32::MAX), 2).await
    }

    /// A voucher on sale from a minute ago for `hours`, free, with the
    /// default payment window.
    pub async fn create_voucher(
        &self,
        mode: SaleMode,
        stock: i64,
        hours: i64,
    ) -> anyhow::Result<i64> {
        self.create_sale(NewSale::free(mode, stock, hours)).await
    }

    pub async fn create_sale(&self, sale: NewSale) -> anyhow::Result<i64> {
        let now = Utc::now();
        let mut body = json!({
            "title": "load test",
            "stock": sale.stock,
            "sale_mode": sale.mode.name(),
            "begin_time": now - chrono::Duration::minutes(1),
            "end_time": now + chrono::Duration::hours(sale.hours),
            "price_cents": sale.price_cents,
            "pay_within_seconds": sale.pay_within_seconds,
        });
        // Sent only where it says more than the default, so that a crowd of
        // one unit each runs against a service from before units too.
        if sale.max_units_per_user != 1 {
            body["max_units_per_user"] = json!(sale.max_units_per_user);
        }
        self.create_voucher_from(body).await
    }

    /// A voucher from a whole creation body, for what [`NewSale`] does not
    /// say (a begin time ahead, a waiting room).
    pub async fn create_voucher_from(&self, body: Value) -> anyhow::Result<i64> {
        self.api.create_voucher(&body).await
    }

    /// [`Admin::tokens`], shared cheaply by the requests of a plan.
    pub async fn shared_tokens(&self, first: i64, count: i64) -> anyhow::Result<Vec<Arc<str>>> {
        Ok(self
            .tokens(first, count)
            .await?
            .into_iter()
            .map(Arc::from)
            .collect())
    }

    /// Tokens for users `first..first + count`, in order.
    pub async fn tokens(&self, first: i64, count: i64) -> anyhow::Result<Vec<String>> {
        let users: Vec<i64> = (first..first + count).collect();
        self.api.tokens(&users, 7200).await
    }

    pub async fn stats(&self, voucher: i64) -> anyhow::Result<Stats> {
        self.api.stats(voucher).await
    }

    /// Reconciles an async voucher's Redis side with Postgres; its report
    /// (`stock`, `pending`, `buyers`, `unstored`).
    pub async fn reconcile(&self, voucher: i64) -> anyhow::Result<Value> {
        self.api.reconcile(voucher).await
    }

    /// (order id, user id) of every live (unpaid or paid) order of a voucher.
    pub async fn orders(&self, voucher: i64) -> anyhow::Result<Vec<(String, i64)>> {
        Ok(self
            .order_lines(voucher)
            .await?
            .into_iter()
            .filter(OrderLine::is_live)
            .map(|line| (line.order_id, line.user_id))
            .collect())
    }

    /// Every stored order of a voucher, closed ones too.
    pub async fn order_lines(&self, voucher: i64) -> anyhow::Result<Vec<OrderLine>> {
        self.api.order_lines(voucher).await
    }

    /// A lab voucher (the service must run with SECKILL_LAB=1).
    pub async fn lab_voucher(&self, stock: i64) -> anyhow::Result<i64> {
        let body = json!({ "stock": stock });
        let created = self
            .api
            .call(reqwest::Method::POST, "/admin/lab/vouchers", Some(&body))
            .await?;
        created["id"]
            .as_i64()
            .with_context(|| format!("no id in {created}"))
    }

    pub async fn lab_stats(&self, voucher: i64) -> anyhow::Result<LabStats> {
        self.api
            .get(&format!("/admin/lab/vouchers/{voucher}/stats"))
            .await
    }

    /// Buys the voucher's units with users the load will not use.
    pub async fn buy_out(&self, voucher: i64, token: &str) -> anyhow::Result<()> {
        let response = self
            .api
            .client()
            .post(format!("{}/seckill/{voucher}", self.api.base()))
            .bearer_auth(token)
            .send()
            .await?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "buying out the voucher: {}",
                response.status()
            ))
        }
    }
}
