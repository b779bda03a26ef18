//! `loadtest failover`: a sale through `kill -9`s of the Postgres primary.
//! It owns its cluster (three Patroni nodes in synchronous mode, etcd,
//! haproxy: `scripts/ha.sh` in a directory of its own under the temp
//! directory, stopped at the end whatever happened), a service whose
//! database lives on that cluster, a steady crowd of distinct buyers, and
//! the per-kill figures: how long until an order is committed again, what
//! the failover cost in 503s, whether any answered order went missing, and
//! the throughput before and after. Optionally, the price of synchronous
//! replication: the same short crowd against the shared single Postgres.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use seckill::token::TokenSigner;
use serde_json::json;
use sqlx::Connection;

use crate::api::{Admin, SaleMode};
use crate::drive::Tally;
use crate::invariants::check;
use crate::service::Target;
use crate::table::Table;
use crate::{round, TargetArgs};

/// When the run began: progress lines say how far into it they are.
static BEGAN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// A progress line on stderr, stamped with the seconds since the start.
macro_rules! say {
    ($($arg:tt)*) => {
        eprintln!(
            "failover {:7.1}s: {}",
            BEGAN.get_or_init(Instant::now).elapsed().as_secs_f64(),
            format!($($arg)*)
        )
    };
}

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

/// A cluster brought up by `scripts/ha.sh up` in a directory of its own in
/// the temp directory (run as root, Postgres runs as the `postgres` user,
/// which may not reach into the repository); `down` when dropped, so an
/// error anywhere still stops it.
struct Cluster {
    dir: PathBuf,
    /// haproxy's address as a URL without a database name.
    server: String,
}

impl Cluster {
    fn up() -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!(
            "seckill-ha-loadtest-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        // Owned before `up` runs: a failed start is stopped by Drop too.
        let mut cluster = Self {
            dir,
            server: String::new(),
        };
        let out = cluster.script("up")?;
        if !out.status.success() {
            return Err(format!(
                "scripts/ha.sh up failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let url = stdout
            .lines()
            .find_map(|line| line.strip_prefix("DATABASE_URL="))
            .ok_or("scripts/ha.sh up printed no DATABASE_URL=")?;
        cluster.server = url
            .rsplit_once('/')
            .ok_or_else(|| format!("no database in {url}"))?
            .0
            .to_owned();
        Ok(cluster)
    }

    fn script(&self, command: &str) -> Result<Output, String> {
        Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ha.sh"))
            .arg(command)
            .env("HA_DIR", &self.dir)
            .output()
            .map_err(|e| format!("cannot run scripts/ha.sh: {e}"))
    }

    fn run(&self, command: &str) -> Result<String, String> {
        let out = self.script(command)?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!("scripts/ha.sh {command} failed:\n{text}"))
        }
    }

    /// A leader and a synchronous standby running (or, in newer Patroni,
    /// streaming), as `patronictl list` shows them: until then a second kill could leave nobody to promote.
    fn has_sync_standby(&self) -> bool {
        self.run("status").is_ok_and(|table| {
            table.lines().any(|l| {
                l.contains("Sync Standby") && (l.contains("streaming") || l.contains("running"))
            }) && table
                .lines()
                .any(|l| l.contains("Leader") && l.contains("running"))
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        say!("stopping the cluster");
        if let Err(e) = self.run("down") {
            say!("{e}");
        }
    }
}

/// How one purchase went.
#[derive(Clone)]
struct Answer {
    /// 0: no HTTP answer (transport error).
    status: u16,
    order_id: Option<String>,
    error: String,
    sent: Instant,
    answered: Instant,
}

/// A steady crowd: `connections` buyers, each a new user at every
/// purchase, until stopped. Every answer goes into one log that the run
/// reads while the crowd goes on (resumption) and after (the books).
struct Crowd {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Answer>>>,
    tasks: tokio::task::JoinSet<()>,
}

impl Crowd {
    fn start(base: &str, voucher: i64, secret: &str, connections: usize) -> Self {
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

    fn len(&self) -> usize {
        self.log.lock().expect("log lock").len()
    }

    /// The answers from position `from` on.
    fn since(&self, from: usize) -> Vec<Answer> {
        self.log.lock().expect("log lock")[from..].to_vec()
    }

    async fn finish(mut self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        while self.tasks.join_next().await.is_some() {}
        std::mem::take(&mut *self.log.lock().expect("log lock"))
    }
}

/// Taken purchases per second answered in `[from, from + span)`.
fn rate(answers: &[Answer], taken: u16, from: Instant, span: Duration) -> f64 {
    let n = answers
        .iter()
        .filter(|a| a.status == taken && a.answered >= from && a.answered < from + span)
        .count();
    n as f64 / span.as_secs_f64().max(1e-9)
}

/// The ids among `ids` stored in the voucher's orders, read through
/// haproxy (a fresh connection: one opened before a failover is cut).
async fn stored_ids(url: &str, voucher: i64, ids: &[i64]) -> Result<HashSet<i64>, String> {
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
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err("reading the orders took over 5 s".into()),
    }
}

fn ids_of(answers: &[Answer], taken: u16) -> Vec<i64> {
    answers
        .iter()
        .filter(|a| a.status == taken)
        .filter_map(|a| a.order_id.as_deref()?.parse().ok())
        .collect()
}

/// One kill's figures.
struct Kill {
    /// From the kill to the first order committed (sync: answered 200;
    /// async: answered 202 and found stored) for a purchase sent after it.
    first_commit: Duration,
    /// From the kill until a synchronous standby streamed again.
    sync_standby_back: Option<Duration>,
    at: Instant,
    resumed: Instant,
}

/// Purchases of a sync voucher per second for `seconds`, on `target`'s
/// service: one side of the single-node vs replicated comparison.
async fn sync_rate(
    target: &Target,
    secret: &str,
    connections: usize,
    seconds: u64,
) -> Result<f64, String> {
    let voucher = Admin::new(target).endless_voucher(SaleMode::Sync).await?;
    let crowd = Crowd::start(&target.base, voucher, secret, connections);
    // A second of warm-up: connections opened, statements prepared.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let from = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let answers = crowd.finish().await;
    Ok(rate(&answers, 200, from, Duration::from_secs(seconds)))
}

/// Sync purchases/s with synchronous replication (the cluster) against a
/// single node (the shared server), `ratio_rounds` rounds back to back so
/// that both sides see the machine's same moods.
async fn replication_price(
    cluster: &Target,
    single: &Target,
    secret: &str,
    args: &FailoverArgs,
) -> Result<serde_json::Value, String> {
    let (mut replicated, mut alone) = (Vec::new(), Vec::new());
    for round in 1..=args.ratio_rounds {
        say!(
            "replication's price, round {round}/{}: {} s of sync purchases on the cluster and on the single node",
            args.ratio_rounds,
            args.ratio_seconds
        );
        // Each side first in every other round: neither always meets the
        // machine warmed by the other.
        let rate = |target| sync_rate(target, secret, args.connections, args.ratio_seconds);
        if round % 2 == 1 {
            replicated.push(rate(cluster).await?);
            alone.push(rate(single).await?);
        } else {
            alone.push(rate(single).await?);
            replicated.push(rate(cluster).await?);
        }
    }
    let median = |rates: &[f64]| {
        let mut sorted = rates.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    };
    let ratio = median(&replicated) / median(&alone);
    let each: Vec<f64> = replicated
        .iter()
        .zip(&alone)
        .map(|(r, a)| round(r / a))
        .collect();
    println!(
        "sync purchases/s, median of {} rounds: single node {:.0}, synchronous replication {:.0}: \
         ratio {ratio:.2} (goal >= 0.7; per round {each:?})",
        args.ratio_rounds,
        median(&alone),
        median(&replicated)
    );
    Ok(json!({
        "rounds": args.ratio_rounds,
        "seconds": args.ratio_seconds,
        "replicated_sync_per_sec": replicated.iter().map(|r| round(*r)).collect::<Vec<_>>(),
        "single_node_sync_per_sec": alone.iter().map(|r| round(*r)).collect::<Vec<_>>(),
        "ratio_per_round": each,
        "replicated_vs_single": round(ratio),
        "met": ratio >= 0.7,
    }))
}

pub async fn run(target_args: &TargetArgs, args: &FailoverArgs) -> Result<bool, String> {
    BEGAN.get_or_init(Instant::now);
    if target_args.url.is_some() {
        return Err("failover starts its own cluster and service; drop --url".into());
    }
    say!("bringing up the cluster (scripts/ha.sh up)");
    let cluster = tokio::task::spawn_blocking(Cluster::up)
        .await
        .map_err(|e| e.to_string())??;
    say!("cluster up, haproxy at {}", cluster.server);
    let result = sale(&cluster, target_args, args).await;
    drop(cluster);
    result
}

async fn sale(
    cluster: &Cluster,
    target_args: &TargetArgs,
    args: &FailoverArgs,
) -> Result<bool, String> {
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

/// The sale through the kills, then its books. `(ok, summary)`.
async fn kills(
    cluster: &Cluster,
    target: &Target,
    secret: &str,
    database_url: &str,
    args: &FailoverArgs,
) -> Result<(bool, serde_json::Value), String> {
    let window = Duration::from_secs(args.window);
    let taken = args.mode.taken();
    let mut summary = json!({
        "scenario": "failover",
        "mode": args.mode.sale_mode().name(),
        "kills": args.kills,
        "connections": args.connections,
    });
    let admin = Admin::new(target);
    let voucher = admin.endless_voucher(args.mode.sale_mode()).await?;
    let started_unix = chrono::Utc::now().timestamp();
    let crowd = Crowd::start(&target.base, voucher, secret, args.connections);
    say!(
        "{} sale, {} buyers; {} s before the first kill",
        args.mode.sale_mode().name(),
        args.connections,
        args.window
    );
    tokio::time::sleep(window).await;
    let (done, failure) = kill_in_turn(cluster, &crowd, database_url, voucher, args).await;
    let answers = crowd.finish().await;
    let ended = Instant::now();

    let ids = ids_of(&answers, taken);
    let stored = stored_after(database_url, voucher, &ids, args, ended).await;
    let (rows, missing_total) = per_kill(&done, &answers, taken, &stored, window, ended);
    // Orders taken before the first kill are checked too.
    let missing_all = ids.iter().filter(|id| !stored.contains(id)).count();
    let mut problems = books(target, voucher, &answers, taken, started_unix).await;
    if missing_all > 0 {
        problems.push(format!(
            "{missing_all} orders answered {taken} are not in the database"
        ));
    }
    if done.len() < args.kills {
        problems.push(format!("{} of {} kills done", done.len(), args.kills));
    }
    if let Some(e) = failure {
        problems.push(e);
    }
    for p in &problems {
        println!("  FAILED: {p}");
    }
    summary["taken"] = json!(ids.len());
    summary["answers"] = json!(answers.len());
    summary["missing"] = json!(missing_all);
    summary["missing_after_kills"] = json!(missing_total);
    summary["per_kill"] = json!(rows);
    summary["problems"] = json!(problems);
    Ok((problems.is_empty(), summary))
}

/// `args.kills` kills of the primary, each once a synchronous standby runs
/// and then once the sale resumed and a window passed; the kills done, and
/// why the next could not be, if one could not.
async fn kill_in_turn(
    cluster: &Cluster,
    crowd: &Crowd,
    database_url: &str,
    voucher: i64,
    args: &FailoverArgs,
) -> (Vec<Kill>, Option<String>) {
    let window = Duration::from_secs(args.window);
    let taken = args.mode.taken();
    let mut done: Vec<Kill> = Vec::new();
    let mut failure = None;
    for k in 1..=args.kills {
        // A cluster with no synchronous standby has nobody to promote.
        let waited = Instant::now();
        while !cluster.has_sync_standby() {
            if waited.elapsed() > Duration::from_secs(args.resume_timeout) {
                failure = Some(format!(
                    "no synchronous standby {} s before kill {k}",
                    args.resume_timeout
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if failure.is_some() {
            break;
        }
        let mark = crowd.len();
        let at = Instant::now();
        if let Err(e) = cluster.run("kill-primary") {
            failure = Some(e);
            break;
        }
        say!("kill {k}: sent kill -9 to the primary");
        let resumed = match resumption(crowd, mark, at, taken, database_url, voucher, args).await {
            Ok(resumed) => resumed,
            Err(e) => {
                failure = Some(format!(
                    "kill {k}: {e}\n{}",
                    cluster.run("status").unwrap_or_default()
                ));
                break;
            }
        };
        say!(
            "kill {k}: first order committed {:.2} s after the kill",
            (resumed - at).as_secs_f64()
        );
        let mut sync_standby_back = None;
        let after = Instant::now();
        while after.elapsed() < window {
            if sync_standby_back.is_none() && cluster.has_sync_standby() {
                sync_standby_back = Some(at.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        done.push(Kill {
            first_commit: resumed - at,
            sync_standby_back,
            at,
            resumed,
        });
    }
    (done, failure)
}

/// The orders among `ids` that the database holds. Async: every accepted
/// order must reach Postgres, so the writers are waited for (at most
/// `drain_timeout`); sync: what is not there at the first reading never
/// will be.
async fn stored_after(
    database_url: &str,
    voucher: i64,
    ids: &[i64],
    args: &FailoverArgs,
    ended: Instant,
) -> HashSet<i64> {
    let mut stored = HashSet::new();
    let mut read = false;
    let deadline = Instant::now() + Duration::from_secs(args.drain_timeout);
    loop {
        match stored_ids(database_url, voucher, ids).await {
            Ok(found) => {
                stored = found;
                read = true;
            }
            Err(e) => say!("reading the orders: {e}"),
        }
        // Sync: what is not there at the first reading never will be.
        let sync_read = args.mode == FailoverMode::Sync && read;
        if stored.len() == ids.len() || sync_read || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if args.mode == FailoverMode::Async {
        say!(
            "{} of {} accepted orders stored {:.1} s after the sale",
            stored.len(),
            ids.len(),
            ended.elapsed().as_secs_f64()
        );
    }
    stored
}

/// Per kill, the answers sent from it to the next kill (or the end): the
/// table printed, its rows as JSON, and how many taken orders are missing.
fn per_kill(
    done: &[Kill],
    answers: &[Answer],
    taken: u16,
    stored: &HashSet<i64>,
    window: Duration,
    ended: Instant,
) -> (Vec<serde_json::Value>, usize) {
    let mut table = Table::new([
        "kill",
        "first commit s",
        "sync standby back s",
        "503",
        "other non-2xx",
        "taken",
        "missing",
        "before /s",
        "after /s",
    ]);
    let mut rows = Vec::new();
    let mut missing_total = 0;
    for (i, kill) in done.iter().enumerate() {
        let until = done.get(i + 1).map_or(ended, |next| next.at);
        let span: Vec<&Answer> = answers
            .iter()
            .filter(|a| a.sent >= kill.at && a.sent < until)
            .collect();
        let unavailable = span.iter().filter(|a| a.status == 503).count();
        let other = span
            .iter()
            .filter(|a| a.status != taken && a.status != 503)
            .count();
        let took: Vec<i64> = span
            .iter()
            .filter(|a| a.status == taken)
            .filter_map(|a| a.order_id.as_deref()?.parse().ok())
            .collect();
        let missing = took.iter().filter(|id| !stored.contains(id)).count();
        missing_total += missing;
        let before = rate(answers, taken, kill.at - window, window);
        let after = rate(answers, taken, kill.resumed, window);
        table.row([
            (i + 1).to_string(),
            format!("{:.2}", kill.first_commit.as_secs_f64()),
            kill.sync_standby_back
                .map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64())),
            unavailable.to_string(),
            other.to_string(),
            took.len().to_string(),
            missing.to_string(),
            format!("{before:.0}"),
            format!("{after:.0}"),
        ]);
        rows.push(json!({
            "kill": i + 1,
            "first_commit_s": round(kill.first_commit.as_secs_f64()),
            "sync_standby_back_s": kill.sync_standby_back.map(|d| round(d.as_secs_f64())),
            "answered_503": unavailable,
            "other_non_2xx": other,
            "taken": took.len(),
            "missing": missing,
            "before_per_sec": round(before),
            "after_per_sec": round(after),
        }));
    }
    print!("{}", table.text());
    (rows, missing_total)
}

/// The books: the contract's invariants over the whole sale, and no answer
/// but `taken` and 503; the problems found. A 503 is an answer whose
/// outcome the buyer cannot know (its commit may have landed before the
/// connection was cut): counted as a transport error, so that the exact
/// "orders == answers taken" rule gives way to "every answer taken is an
/// order".
async fn books(
    target: &Target,
    voucher: i64,
    answers: &[Answer],
    taken: u16,
    started_unix: i64,
) -> Vec<String> {
    let mut tally = Tally::new();
    tally.requests = answers.len() as u64;
    tally
        .statuses
        .insert(taken.to_string(), ids_of(answers, taken).len() as u64);
    let unavailable = answers.iter().filter(|a| a.status == 503).count() as u64;
    if unavailable > 0 {
        tally
            .statuses
            .insert("error: 503 during a failover".into(), unavailable);
    }
    tally.order_ids = answers
        .iter()
        .filter(|a| a.status == taken)
        .filter_map(|a| a.order_id.clone())
        .collect();
    let mut problems = Vec::new();
    match check(target, voucher, &tally, started_unix - 5, None, 0).await {
        Ok(c) => problems.extend(c.problems),
        Err(e) => problems.push(format!("the invariants could not be read: {e}")),
    }
    let mut others: BTreeMap<String, usize> = BTreeMap::new();
    for a in answers
        .iter()
        .filter(|a| a.status != taken && a.status != 503)
    {
        *others
            .entry(format!("{} {}", a.status, a.error))
            .or_default() += 1;
    }
    if !others.is_empty() {
        problems.push(format!("answers other than {taken} and 503: {others:?}"));
    }
    problems
}

/// With no answer but taken ones this long after a kill (async: Redis
/// accepts throughout), the outage is taken to start at the kill.
const NO_OUTAGE: Duration = Duration::from_secs(3);

/// Waits for the first order committed for a purchase sent after the
/// kill's outage began: sync, its 200; async, its 202 found stored (polled every 100 ms,
/// so up to that much late). The instant it was seen.
async fn resumption(
    crowd: &Crowd,
    mark: usize,
    at: Instant,
    taken: u16,
    database_url: &str,
    voucher: i64,
    args: &FailoverArgs,
) -> Result<Instant, String> {
    let bound = Duration::from_secs(args.resume_timeout);
    loop {
        let recent = crowd.since(mark);
        // The postmaster's death does not stop its backends at once: a
        // purchase sent just after the kill may still commit on the old
        // primary. The sale has resumed once an order is committed for a
        // purchase sent after the outage showed (its first 503); with no
        // 503 at all, after the kill.
        let outage = recent
            .iter()
            .filter(|a| a.sent >= at && a.status != taken)
            .map(|a| a.answered)
            .min();
        let from = match outage {
            Some(outage) => outage,
            None if at.elapsed() > NO_OUTAGE => at,
            None => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let after: Vec<&Answer> = recent
            .iter()
            .filter(|a| a.sent >= from && a.status == taken)
            .collect();
        match args.mode {
            FailoverMode::Sync => {
                if let Some(first) = after.iter().map(|a| a.answered).min() {
                    return Ok(first);
                }
            }
            FailoverMode::Async => {
                let ids: Vec<i64> = after
                    .iter()
                    .filter_map(|a| a.order_id.as_deref()?.parse().ok())
                    .collect();
                if !ids.is_empty() {
                    if let Ok(found) = stored_ids(database_url, voucher, &ids).await {
                        if !found.is_empty() {
                            return Ok(Instant::now());
                        }
                    }
                }
            }
        }
        if at.elapsed() > bound {
            return Err(format!("no order committed within {bound:?} of the kill"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
