//! The steady crowd of buyers, its log of answers, and what the log says.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use seckill::token::TokenSigner;
use sqlx::Connection;

/// How one purchase went.
#[derive(Clone)]
pub(super) struct Answer {
    /// 0: no HTTP answer (transport error).
    pub status: u16,
    pub order_id: Option<String>,
    pub error: String,
    pub sent: Instant,
    pub answered: Instant,
}

/// A steady crowd: `connections` buyers, each a new user at every
/// purchase, until stopped. Every answer goes into one log that the run
/// reads while the crowd goes on (resumption) and after (the books).
pub(super) struct Crowd {
    pub stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Answer>>>,
    tasks: tokio::task::JoinSet<()>,
}

impl Crowd {
    pub(super) fn start(base: &str, voucher: i64, secret: &str, connections: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let next_user = Arc::new(AtomicI64::new(1));
        // Signed here with the service's own secret: minting a token per
        // purchase through the admin API would cost as much as the sale.
        let signer = TokenSigner::new(secret.as_bytes());
        let expires = chrono::Utc::now().timestamp() + 6 * 3_600;
        let url = format!("{base}/seckill/{voucher}");
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            .pool_max_idle_per_host(connections)
            .build()
            .expect("an HTTP client");
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..connections {
            let (stop, log, next_user) = (stop.clone(), log.clone(), next_user.clone());
            let (signer, url, client) = (signer.clone(), url.clone(), client.clone());
            tasks.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let user = next_user.fetch_add(1, Ordering::Relaxed);
                    let token = signer.sign(user, expires);
                    let sent = Instant::now();
                    let answer = match client.post(&url).bearer_auth(&token).send().await {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            let body: serde_json::Value = response.json().await.unwrap_or_default();
                            Answer {
                                status,
                                order_id: body["order_id"].as_str().map(str::to_owned),
                                error: body["error"].as_str().unwrap_or("").to_owned(),
                                sent,
                                answered: Instant::now(),
                            }
                        }
                        Err(e) => Answer {
                            status: 0,
                            order_id: None,
                            error: e.to_string(),
                            sent,
                            answered: Instant::now(),
                        },
                    };
                    let unavailable = answer.status == 503;
                    log.lock().expect("log lock").push(answer);
                    // As a buyer honouring Retry-After would, sooner, to
                    // see the sale resume.
                    if unavailable {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            });
        }
        Self { stop, log, tasks }
    }

    pub(super) fn len(&self) -> usize {
        self.log.lock().expect("log lock").len()
    }

    /// The answers from position `from` on.
    pub(super) fn since(&self, from: usize) -> Vec<Answer> {
        self.log.lock().expect("log lock")[from..].to_vec()
    }

    pub(super) async fn finish(mut self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        while self.tasks.join_next().await.is_some() {}
        std::mem::take(&mut *self.log.lock().expect("log lock"))
    }
}

/// Taken purchases per second answered in `[from, from + span)`.
pub(super) fn rate(answers: &[Answer], taken: u16, from: Instant, span: Duration) -> f64 {
    let n = answers
        .iter()
        .filter(|a| a.status == taken && a.answered >= from && a.answered < from + span)
        .count();
    n as f64 / span.as_secs_f64().max(1e-9)
}

/// The ids among `ids` stored in the voucher's orders, read through
/// haproxy (a fresh connection: one opened before a failover is cut).
pub(super) async fn stored_ids(
    url: &str,
    voucher: i64,
    ids: &[i64],
) -> anyhow::Result<HashSet<i64>> {
    let read = async {
        let mut conn = sqlx::PgConnection::connect(url).await?;
        let rows: Vec<(i64,)> =
            sqlx::query_as("SELECT id FROM voucher_orders WHERE voucher_id = $1 AND id = ANY($2)")
                .bind(voucher)
                .bind(ids)
                .fetch_all(&mut conn)
                .await?;
        Ok::<_, sqlx::Error>(rows.into_iter().map(|(id,)| id).collect())
    };
    match tokio::time::timeout(Duration::from_secs(5), read).await {
        Ok(result) => Ok(result?),
        Err(_) => anyhow::bail!("reading the orders took over 5 s"),
    }
}

pub(super) fn ids_of(answers: &[Answer], taken: u16) -> Vec<i64> {
    answers
        .iter()
        .filter(|a| a.status == taken)
        .filter_map(|a| a.order_id.as_deref()?.parse().ok())
        .collect()
}
