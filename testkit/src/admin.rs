//! The admin API as the tests and the load driver call it: vouchers
//! created, user tokens minted, a voucher's books, orders and
//! reconciliation, the lab's vouchers, each answer read into its type or
//! refused with the route, the status and the body in the error.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// Most user ids one `POST /admin/tokens` takes.
const TOKENS_PER_CALL: usize = 10_000;

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

/// A voucher to create, on sale from a minute ago.
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

/// What a lab voucher's rows say (`GET /admin/lab/vouchers/{id}/stats`).
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

/// One instance's admin API, called with the admin token.
#[derive(Clone)]
pub struct AdminApi {
    client: reqwest::Client,
    base: String,
    token: String,
    /// How many `429`s and `503`s in a row are waited out (their
    /// `Retry-After`, 1 to 5 s) before one is the answer.
    patience: u32,
}

/// A voucher's books as `GET /admin/vouchers/{id}/stats` tells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct Stats {
    pub initial_stock: i64,
    pub stock: i64,
    /// Live orders: unpaid + paid.
    pub orders: i64,
    /// Units of the live orders, pending ones of an async sale too (a
    /// service from before units, which does not say, sells one unit an
    /// order: [`AdminApi::stats`] counts them so).
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

/// One line of a voucher's order listing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct OrderLine {
    pub order_id: String,
    pub user_id: i64,
    /// `unpaid`, `paid`, `cancelled` or `expired`.
    pub status: String,
    /// Units it holds (a service from before units lists none: one).
    #[serde(default = "one")]
    pub quantity: i64,
}

fn one() -> i64 {
    1
}

impl OrderLine {
    /// Whether the order holds its units (`unpaid` or `paid`).
    pub fn is_live(&self) -> bool {
        matches!(self.status.as_str(), "unpaid" | "paid")
    }
}

impl AdminApi {
    /// The admin API at `base` (`http://host:port`) with `token`; a refusal
    /// is the answer at once.
    pub fn new(base: impl Into<String>, token: impl Into<String>) -> Self {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("an HTTP client");
        Self::using(client, base, token)
    }

    /// [`AdminApi::new`] through the caller's `client` (its connections
    /// and its timeout).
    pub fn using(
        client: reqwest::Client,
        base: impl Into<String>,
        token: impl Into<String>,
    ) -> Self {
        Self {
            client,
            base: base.into(),
            token: token.into(),
            patience: 0,
        }
    }

    /// The same API, waiting out up to `refusals` `429`s and `503`s in a
    /// row (a load driver beside the service's limits and its shedder,
    /// which refuses the admin's calls first).
    pub fn patient(self, refusals: u32) -> Self {
        Self {
            patience: refusals,
            ..self
        }
    }

    /// The instance it calls.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The HTTP client it calls with (its timeout bounds every call).
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// `method path` with `body`: the answer's JSON (null for none), or an
    /// error naming the route, the status and the body.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let (status, answer) = self.answer(method, path, body).await?;
        anyhow::ensure!(status.is_success(), "{path}: {status} {answer}");
        Ok(answer)
    }

    /// `method path` with `body`: the status and the answer's JSON (null
    /// for none), whatever the status.
    async fn answer(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let mut refused = 0;
        let response = loop {
            let mut request = self
                .client
                .request(method.clone(), format!("{}{path}", self.base))
                .bearer_auth(&self.token);
            if let Some(body) = body {
                request = request
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.to_string());
            }
            let response = request.send().await.with_context(|| path.to_owned())?;
            let again = [
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::SERVICE_UNAVAILABLE,
            ];
            if !again.contains(&response.status()) || refused == self.patience {
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
        let text = response.text().await.with_context(|| path.to_owned())?;
        let body: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).with_context(|| format!("{path}: {status} {text}"))?
        };
        Ok((status, body))
    }

    /// A GET, its answer read as `T`.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let answer = self.call(Method::GET, path, None).await?;
        serde_json::from_value(answer.clone()).with_context(|| format!("{path}: {answer}"))
    }

    /// A voucher from a whole `POST /admin/vouchers` body: its id (the
    /// answer must be `201 Created`).
    pub async fn create_voucher_from(&self, body: &Value) -> anyhow::Result<i64> {
        self.created("/admin/vouchers", body).await
    }

    /// `POST path` with `body`: the id of what it created (the answer must
    /// be `201 Created`).
    async fn created(&self, path: &str, body: &Value) -> anyhow::Result<i64> {
        let (status, created) = self.answer(Method::POST, path, Some(body)).await?;
        anyhow::ensure!(status == StatusCode::CREATED, "{path}: {status} {created}");
        created["id"]
            .as_i64()
            .with_context(|| format!("no id in {created}"))
    }

    /// A voucher of `mode` on sale from a minute ago for `hours`, free,
    /// with the default payment window.
    pub async fn create_voucher(
        &self,
        mode: SaleMode,
        stock: i64,
        hours: i64,
    ) -> anyhow::Result<i64> {
        self.create_sale(NewSale::free(mode, stock, hours)).await
    }

    /// A voucher of `mode` whose stock cannot run out, on sale for two
    /// hours.
    pub async fn endless_voucher(&self, mode: SaleMode) -> anyhow::Result<i64> {
        self.create_voucher(mode, i64::from(i32::MAX), 2).await
    }

    pub async fn create_sale(&self, sale: NewSale) -> anyhow::Result<i64> {
        let now = chrono::Utc::now();
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
        self.create_voucher_from(&body).await
    }

    /// Tokens for users `first..first + count`, in order, living two hours.
    pub async fn tokens(&self, first: i64, count: i64) -> anyhow::Result<Vec<String>> {
        let users: Vec<i64> = (first..first + count).collect();
        self.tokens_for(&users, 7200).await
    }

    /// [`AdminApi::tokens`], shared cheaply by the requests of a plan.
    pub async fn shared_tokens(&self, first: i64, count: i64) -> anyhow::Result<Vec<Arc<str>>> {
        let tokens = self.tokens(first, count).await?;
        Ok(tokens.into_iter().map(Arc::from).collect())
    }

    /// Tokens of `user_ids`, in their order, living `ttl_seconds`; minted
    /// [`TOKENS_PER_CALL`] a call.
    pub async fn tokens_for(
        &self,
        user_ids: &[i64],
        ttl_seconds: i64,
    ) -> anyhow::Result<Vec<String>> {
        #[derive(serde::Deserialize)]
        struct Minted {
            tokens: Vec<UserToken>,
        }
        #[derive(serde::Deserialize)]
        struct UserToken {
            user_id: i64,
            token: String,
        }
        let mut tokens = Vec::with_capacity(user_ids.len());
        for ids in user_ids.chunks(TOKENS_PER_CALL) {
            let body = json!({ "user_ids": ids, "ttl_seconds": ttl_seconds });
            let answer = self
                .call(Method::POST, "/admin/tokens", Some(&body))
                .await?;
            let minted: Minted = serde_json::from_value(answer).context("the tokens' answer")?;
            let minted_for: Vec<i64> = minted.tokens.iter().map(|t| t.user_id).collect();
            anyhow::ensure!(
                minted_for == ids,
                "tokens minted for {} users, not the {} asked for in their order",
                minted_for.len(),
                ids.len()
            );
            tokens.extend(minted.tokens.into_iter().map(|t| t.token));
        }
        Ok(tokens)
    }

    /// A voucher's books (units counted one an order where the service
    /// does not say).
    pub async fn stats(&self, voucher: i64) -> anyhow::Result<Stats> {
        let mut stats: Stats = self
            .get(&format!("/admin/vouchers/{voucher}/stats"))
            .await?;
        if stats.units == unknown() {
            stats.units = stats.pending + stats.unpaid + stats.paid;
        }
        Ok(stats)
    }

    /// The voucher's books, read every 50 ms until `done` holds of them or
    /// `limit` has passed: the last books read, and whether `done` held.
    pub async fn stats_until(
        &self,
        voucher: i64,
        limit: Duration,
        done: impl Fn(&Stats) -> bool,
    ) -> anyhow::Result<(Stats, bool)> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let stats = self.stats(voucher).await?;
            let held = done(&stats);
            if held || tokio::time::Instant::now() >= deadline {
                return Ok((stats, held));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every stored order of a voucher, closed ones too, oldest first.
    pub async fn order_lines(&self, voucher: i64) -> anyhow::Result<Vec<OrderLine>> {
        #[derive(serde::Deserialize)]
        struct Listing {
            orders: Vec<OrderLine>,
        }
        let listing: Listing = self
            .get(&format!("/admin/vouchers/{voucher}/orders"))
            .await?;
        Ok(listing.orders)
    }

    /// Reconciles an async voucher's Redis side with Postgres: its report
    /// (`stock`, `pending`, `buyers`, `unstored`).
    pub async fn reconcile(&self, voucher: i64) -> anyhow::Result<Value> {
        let path = format!("/admin/vouchers/{voucher}/reconcile");
        self.call(Method::POST, &path, None).await
    }

    /// (order id, user id) of every live (unpaid or paid) order of a voucher.
    pub async fn orders(&self, voucher: i64) -> anyhow::Result<Vec<(String, i64)>> {
        let lines = self.order_lines(voucher).await?;
        Ok(lines
            .into_iter()
            .filter(OrderLine::is_live)
            .map(|line| (line.order_id, line.user_id))
            .collect())
    }

    /// A lab voucher of `stock` units (the service must mount the lab).
    pub async fn lab_voucher(&self, stock: i64) -> anyhow::Result<i64> {
        let body = json!({ "stock": stock });
        self.created("/admin/lab/vouchers", &body).await
    }

    pub async fn lab_stats(&self, voucher: i64) -> anyhow::Result<LabStats> {
        self.get(&format!("/admin/lab/vouchers/{voucher}/stats"))
            .await
    }

    /// Buys one unit of the voucher as the token's user (`200` or an error).
    pub async fn buy_out(&self, voucher: i64, token: &str) -> anyhow::Result<()> {
        let response = self
            .client
            .post(format!("{}/seckill/{voucher}", self.base))
            .bearer_auth(token)
            .send()
            .await?;
        let status = response.status();
        anyhow::ensure!(status.is_success(), "buying out the voucher: {status}");
        Ok(())
    }
}
