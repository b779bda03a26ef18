//! The admin API as the tests and the load driver call it: vouchers
//! created, user tokens minted, a voucher's books, orders and
//! reconciliation, each answer read into its type or refused with the
//! route, the status and the body in the error.

use std::time::Duration;

use anyhow::Context;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// Most user ids one `POST /admin/tokens` takes.
const TOKENS_PER_CALL: usize = 10_000;

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
    pub async fn create_voucher(&self, body: &Value) -> anyhow::Result<i64> {
        let path = "/admin/vouchers";
        let (status, created) = self.answer(Method::POST, path, Some(body)).await?;
        anyhow::ensure!(status == StatusCode::CREATED, "{path}: {status} {created}");
        created["id"]
            .as_i64()
            .with_context(|| format!("no id in {created}"))
    }

    /// Tokens of `user_ids`, in their order, living `ttl_seconds`; minted
    /// [`TOKENS_PER_CALL`] a call.
    pub async fn tokens(&self, user_ids: &[i64], ttl_seconds: i64) -> anyhow::Result<Vec<String>> {
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
}
