//! The kills: the primary killed in turn while the crowd buys, and when
//! orders were committed again after each.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::json;

use super::books::{books, per_kill};
use super::crowd::{ids_of, stored_ids, Answer, Crowd};
use super::{FailoverArgs, FailoverMode};
use crate::service::Target;
use testkit::ha::Cluster;

/// One kill's figures.
pub(super) struct Kill {
    /// From the kill to the first order committed (sync: answered 200;
    /// async: answered 202 and found stored) for a purchase sent after it.
    pub first_commit: Duration,
    /// From the kill until a synchronous standby streamed again.
    pub sync_standby_back: Option<Duration>,
    pub at: Instant,
    pub resumed: Instant,
}

/// The sale through the kills, then its books. `(ok, summary)`.
pub(super) async fn kills(
    cluster: &Cluster,
    target: &Target,
    secret: &str,
    database_url: &str,
    args: &FailoverArgs,
) -> anyhow::Result<(bool, serde_json::Value)> {
    let window = Duration::from_secs(args.window);
    let taken = args.mode.taken();
    let mut summary = json!({
        "scenario": "failover",
        "mode": args.mode.sale_mode().name(),
        "kills": args.kills,
        "connections": args.connections,
    });
    let admin = target.admin();
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
            failure = Some(format!("{e:#}"));
            break;
        }
        say!("kill {k}: sent kill -9 to the primary");
        let resumed = match resumption(crowd, mark, at, taken, database_url, voucher, args).await {
            Ok(resumed) => resumed,
            Err(e) => {
                failure = Some(format!(
                    "kill {k}: {e:#}\n{}",
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
            Err(e) => say!("reading the orders: {e:#}"),
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
) -> anyhow::Result<Instant> {
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
            anyhow::bail!("no order committed within {bound:?} of the kill");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
