//! How one cell is run: a crowd for scarce stock, or stalled pairs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

use super::{LabArgs, Row, Stall};
use crate::api::{Admin, LabStats};
use crate::drive::{self, Request, Tally};
use crate::service::Target;

/// One cell of the grid: a strategy on some instances under one stall.
#[derive(Clone, Copy)]
pub(super) struct Cell<'a> {
    pub admin: &'a Admin,
    pub bases: &'a [Arc<str>],
    pub tokens: &'a [Arc<str>],
    pub strategy: &'static str,
    pub stall: Stall,
    /// Which run of the cell this is.
    pub run: u32,
    pub args: &'a LabArgs,
    /// The progress display's name of the cell.
    pub label: &'a str,
}

impl Cell<'_> {
    /// The cell's row, from what `users` users made of it.
    fn row(&self, users: i64, stats: LabStats, tally: Tally) -> Row {
        Row {
            strategy: self.strategy,
            instances: self.bases.len(),
            stall: self.stall,
            run: self.run,
            users,
            stats,
            tally,
        }
    }
}

fn lab_path(strategy: &str, voucher: i64, stall: Stall, lease: Duration) -> String {
    let path = format!("/lab/{strategy}/seckill/{voucher}");
    match stall {
        Stall::None => path,
        Stall::Crash => format!("{path}?stall_at=crash"),
        at => format!(
            "{path}?stall_at={}&stall_ms={}",
            at.name(),
            lease.as_millis() * 17 / 10
        ),
    }
}

/// Each user's requests at once, spread over the instances, for scarce
/// stock. With `Stall::Crash`, every other user's requests crash between
/// Redis and Postgres; a stream design's writers are then given time to
/// recover what their dead consumer left.
pub(super) async fn crowd(target: &Target, cell: &Cell<'_>) -> anyhow::Result<Row> {
    let (admin, args, bases) = (cell.admin, cell.args, cell.bases);
    let voucher = admin.lab_voucher(args.stock).await?;
    let plain = lab_path(cell.strategy, voucher, Stall::None, args.lease());
    let crashing = lab_path(cell.strategy, voucher, cell.stall, args.lease());
    // A user's requests stand next to each other in the plan, so that
    // different connections send them at the same moment.
    let users = usize::try_from(args.users).unwrap_or(0);
    let plan: Vec<Request> = cell.tokens[..users]
        .iter()
        .enumerate()
        .flat_map(|(u, token)| (0..args.per_user).map(move |i| (u, i, token.clone())))
        .map(|(u, i, token)| {
            let path = if u % 2 == 1 { &crashing } else { &plain };
            Request::post_to(bases[(u + i) % bases.len()].clone(), path.clone(), token)
        })
        .collect();
    let tally = target.send_each(plan, args.connections, cell.label).await;
    let mut stats = admin.lab_stats(voucher).await?;
    if cell.strategy == "redis_stream" {
        // Accepted orders are written by the stream's writers: wait (at
        // most 20 leases) until every unit Redis handed out is stored.
        let deadline = Instant::now() + args.lease() * 20;
        while stats
            .redis_stock
            .is_some_and(|left| stats.initial_stock - left > stats.orders)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
            stats = admin.lab_stats(voucher).await?;
        }
    }
    Ok(cell.row(args.users, stats, tally))
}

/// Stalled pairs (see the module's text), every user at once.
pub(super) async fn pairs(cell: &Cell<'_>) -> anyhow::Result<Row> {
    let (admin, args, bases) = (cell.admin, cell.args, cell.bases);
    // Plenty of stock: these rows are about users, not units.
    let voucher = admin.lab_voucher(args.pairs * 10).await?;
    let path = lab_path(cell.strategy, voucher, cell.stall, args.lease());
    let users = usize::try_from(args.pairs).unwrap_or(0);
    let progress = ProgressBar::new(users as u64).with_prefix(cell.label.to_owned());
    progress.set_style(
        ProgressStyle::with_template("{prefix:>28} [{bar:40}] {pos}/{len} pairs")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let client = drive::client(users * 2);
    let (lease, started) = (args.lease(), Instant::now());
    let tasks: Vec<_> = cell.tokens[..users]
        .iter()
        .map(|token| {
            let a = Request::post_to(bases[0].clone(), path.clone(), token.clone());
            let b = Request::post_to(bases[bases.len() - 1].clone(), path.clone(), token.clone());
            let (client, progress) = (client.clone(), progress.clone());
            tokio::spawn(async move {
                let first = drive::exchange(&client, "", &a);
                let second = async {
                    let mut answers = Vec::new();
                    tokio::time::sleep(lease * 12 / 10).await;
                    let give_up = Instant::now() + lease * 4;
                    loop {
                        let answered = drive::exchange(&client, "", &b).await;
                        let again =
                            answered.key == "429 purchase_in_progress" && Instant::now() < give_up;
                        answers.push(answered);
                        if !again {
                            break answers;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                };
                let (first, mut answers) = tokio::join!(first, second);
                answers.push(first);
                progress.inc(1);
                answers
            })
        })
        .collect();
    // The pairs hand back answers, counted in the run's one tally (a tally
    // each would zero a 150 KB histogram per user, as drive.rs says).
    let mut tally = Tally::starting_at(started);
    for task in tasks {
        for answered in task.await.context("a pair panicked")? {
            tally.record(answered);
        }
    }
    tally.elapsed = started.elapsed();
    progress.finish_and_clear();
    Ok(cell.row(args.pairs, admin.lab_stats(voucher).await?, tally))
}
