//! The admin side of the API that the driver needs: vouchers, tokens,
//! stats and order listings, and the lab's vouchers and stats.

use std::sync::Arc;
use std::time::Duration;

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

pub struct Admin<'a> {
    client: reqwest::Client,
    target: &'a Target,
    /// The instance it calls.
    base: &'a str,
}

#[derive(Debug, Clone, Copy, serde::Deserialize)]
pub struct Stats {
    pub initial_stock: i64,
    pub stock: i64,
    /// Live orders: unpaid + paid.
    pub orders: i64,
    /// Units of the live orders, pending ones of an async sale too (a
    /// service from before units, which does not say, sells one unit per
    /// order: see [`Admin::stats`]).
    #[serde(default = "unknown")]
    pub units: i64,
    pub distinct_users: i64,
    /// Async: accepted by Redis, not yet stored.
    pub pending: i64,
    pub unpaid: i64,
    pub paid: i64,
    pub cancelled: i64,
    pub expired: i64,
}

/// What [`Stats::units`] holds until read: no count of units is negative.
fn unknown() -> i64 {
    -1
}

impl Stats {
    /// The conservation law, at the moment of the snapshot: `stock +
    /// units = initial_stock` (units of the pending, unpaid and paid
    /// orders), stock never below 0.
    pub fn conserved(&self) -> bool {
        self.stock >= 0 && self.stock + self.units == self.initial_stock
    }
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

/// One line of a voucher's order listing.
#[derive(Debug, Clone)]
pub struct OrderLine {
    pub order_id: String,
    pub user_id: i64,
    /// `unpaid`, `paid`, `cancelled` or `expired`.
    pub status: String,
    /// Units it holds.
    pub quantity: i64,
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

impl<'a> Admin<'a> {
    pub fn new(target: &'a Target) -> Self {
        Self::on(target, 0)
    }

    /// The admin API of instance `i` (counted round the instances).
    pub fn on(target: &'a Target, i: usize) -> Self {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("an HTTP client");
        let base = target
            .bases
            .get(i % target.bases.len().max(1))
            .unwrap_or(&target.base);
        Self {
            client,
            target,
            base,
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut refused = 0;
        let response = loop {
            let mut request = self
                .client
                .request(method.clone(), format!("{}{path}", self.base))
                .bearer_auth(&self.target.admin_token);
            if let Some(body) = &body {
                request = request.json(body);
            }
            let response = request.send().await.with_context(|| path.to_owned())?;
            // With the service's limits on (`loadtest abuse`), the admin's
            // calls share the driver's address with the connections it
            // opens before a run, and a saturated instance sheds the
            // admin's calls first: a refusal says when to come back.
            let again = [
                reqwest::StatusCode::TOO_MANY_REQUESTS,
                reqwest::StatusCode::SERVICE_UNAVAILABLE,
            ];
            if !again.contains(&response.status()) || refused == 30 {
                break response;
            }
            refused += 1;
            let wait = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(1)
                .clamp(1, 5);
            tokio::time::sleep(Duration::from_secs(wait)).await;
        };
        let status = response.status();
        let body: Value = response.json().await.with_context(|| path.to_owned())?;
        if !status.is_success() {
            anyhow::bail!("{path}: {status} {body}");
        }
        Ok(body)
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
        let created = self
            .call(reqwest::Method::POST, "/admin/vouchers", Some(body))
            .await?;
        created["id"]
            .as_i64()
            .with_context(|| format!("no id in {created}"))
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
        let mut tokens = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
        let mut next = first;
        while next < first + count {
            let batch: Vec<i64> = (next..(first + count).min(next + 10_000)).collect();
            next += batch.len() as i64;
            let minted = self
                .call(
                    reqwest::Method::POST,
                    "/admin/tokens",
                    Some(json!({ "user_ids": batch, "ttl_seconds": 7200 })),
                )
                .await?;
            for t in minted["tokens"]
                .as_array()
                .context("no tokens in the answer")?
            {
                tokens.push(
                    t["token"]
                        .as_str()
                        .context("a token is not a string")?
                        .to_owned(),
                );
            }
        }
        Ok(tokens)
    }

    pub async fn stats(&self, voucher: i64) -> anyhow::Result<Stats> {
        let mut stats: Stats = self
            .get(&format!("/admin/vouchers/{voucher}/stats"))
            .await?;
        if stats.units == unknown() {
            stats.units = stats.pending + stats.unpaid + stats.paid;
        }
        Ok(stats)
    }

    /// A GET of the admin API, its answer read as `T`.
    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let answer = self.call(reqwest::Method::GET, path, None).await?;
        serde_json::from_value(answer.clone()).with_context(|| format!("{path}: {answer}"))
    }

    /// Reconciles an async voucher's Redis side with Postgres; its report
    /// (`stock`, `pending`, `buyers`, `unstored`).
    pub async fn reconcile(&self, voucher: i64) -> anyhow::Result<Value> {
        self.call(
            reqwest::Method::POST,
            &format!("/admin/vouchers/{voucher}/reconcile"),
            None,
        )
        .await
    }

    /// (order id, user id) of every live (unpaid or paid) order of a voucher.
    pub async fn orders(&self, voucher: i64) -> anyhow::Result<Vec<(String, i64)>> {
        Ok(self
            .order_lines(voucher)
            .await?
            .into_iter()
            .filter(|line| matches!(line.status.as_str(), "unpaid" | "paid"))
            .map(|line| (line.order_id, line.user_id))
            .collect())
    }

    /// Every stored order of a voucher, closed ones too.
    pub async fn order_lines(&self, voucher: i64) -> anyhow::Result<Vec<OrderLine>> {
        let listing = self
            .call(
                reqwest::Method::GET,
                &format!("/admin/vouchers/{voucher}/orders"),
                None,
            )
            .await?;
        listing["orders"]
            .as_array()
            .context("no orders in the answer")?
            .iter()
            .map(|o| {
                match (
                    o["order_id"].as_str(),
                    o["user_id"].as_i64(),
                    o["status"].as_str(),
                    // A service from before units lists no quantity: one.
                    o.get("quantity").map_or(Some(1), Value::as_i64),
                ) {
                    (Some(id), Some(user), Some(status), Some(quantity)) => Ok(OrderLine {
                        order_id: id.to_owned(),
                        user_id: user,
                        status: status.to_owned(),
                        quantity,
                    }),
                    _ => Err(anyhow::anyhow!("malformed order {o}")),
                }
            })
            .collect()
    }

    /// A lab voucher (the service must run with SECKILL_LAB=1).
    pub async fn lab_voucher(&self, stock: i64) -> anyhow::Result<i64> {
        let created = self
            .call(
                reqwest::Method::POST,
                "/admin/lab/vouchers",
                Some(json!({ "stock": stock })),
            )
            .await?;
        created["id"]
            .as_i64()
            .with_context(|| format!("no id in {created}"))
    }

    pub async fn lab_stats(&self, voucher: i64) -> anyhow::Result<LabStats> {
        self.get(&format!("/admin/lab/vouchers/{voucher}/stats"))
            .await
    }

    /// Buys the voucher's units with users the load will not use.
    pub async fn buy_out(&self, voucher: i64, token: &str) -> anyhow::Result<()> {
        let response = self
            .client
            .post(format!("{}/seckill/{voucher}", self.base))
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
