//! The sale's figures: per kill, and the books over the whole sale.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::json;

use super::crowd::{ids_of, rate, Answer};
use super::kills::Kill;
use crate::drive::Tally;
use crate::invariants::check;
use crate::round;
use crate::service::Target;
use crate::table::Table;

/// Per kill, the answers sent from it to the next kill (or the end): the
/// table printed, its rows as JSON, and how many taken orders are missing.
pub(super) fn per_kill(
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
pub(super) async fn books(
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
        Err(e) => problems.push(format!("the invariants could not be read: {e:#}")),
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
