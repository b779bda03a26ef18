//! The grid's claims, anomalies and cells, on rows made up by hand.

use serde_json::json;

use super::grid::{cell_text, Anomalies};
use super::*;
use crate::api::LabStats;
use crate::drive::Tally;

fn row(strategy: &'static str, instances: usize, stall: Stall, stats: LabStats) -> Row {
    Row {
        strategy,
        instances,
        stall,
        run: 1,
        users: 10,
        stats,
        tally: Tally::new(),
    }
}

fn stats(initial: i64, stock: i64, orders: i64, users: i64, foreign: i64) -> LabStats {
    LabStats {
        initial_stock: initial,
        stock,
        orders,
        distinct_users: users,
        foreign_releases: foreign,
        redis_stock: None,
    }
}

#[test]
fn each_anomaly_is_measured() {
    let oversold = row("naive", 1, Stall::None, stats(5, -3, 8, 8, 0));
    assert_eq!((oversold.oversold(), oversold.undersold()), (3, 0));
    // 4 units left while 10 - 6 = 4 users went without.
    let undersold = row("version", 1, Stall::None, stats(10, 4, 6, 6, 0));
    assert_eq!((undersold.oversold(), undersold.undersold()), (0, 4));
    let dup = row("stock_gt_zero", 1, Stall::None, stats(5, 0, 5, 4, 0));
    assert_eq!((dup.duplicate_users(), dup.undersold()), (1, 0));
    let foreign = row("setnx", 2, Stall::Release, stats(100, 90, 10, 10, 3));
    assert!(foreign.broke());
    let clean = row("fenced", 2, Stall::Sale, stats(100, 90, 10, 10, 0));
    assert!(!clean.broke() && !clean.failed());
}

#[test]
fn a_holding_row_that_breaks_fails_and_oversell_fails_past_naive() {
    let broken = row("fenced", 2, Stall::Sale, stats(100, 89, 11, 10, 0));
    assert!(broken.failed());
    assert_eq!(broken.verdict(), "FAILED");
    let expected = row("reentrant", 2, Stall::Sale, stats(100, 89, 11, 10, 0));
    assert!(!expected.failed());
    assert_eq!(expected.verdict(), "as expected");
    let unseen = row("setnx", 1, Stall::Sale, stats(100, 90, 10, 10, 0));
    assert_eq!(unseen.verdict(), "race not seen");
    let naive = row("naive", 1, Stall::None, stats(5, -1, 6, 6, 0));
    assert!(!naive.failed());
    let version = row("version", 1, Stall::Sale, stats(5, -1, 6, 6, 0));
    assert!(version.failed(), "only naive may oversell");
}

#[test]
fn the_claims_match_the_lab_text() {
    assert_eq!(expect("process_mutex", 1, Stall::Sale), Expect::Holds);
    assert_eq!(expect("process_mutex", 2, Stall::None), Expect::Breaks);
    assert_eq!(expect("setnx_owner", 2, Stall::None), Expect::Holds);
    assert_eq!(expect("setnx_owner", 1, Stall::Release), Expect::Breaks);
    assert_eq!(expect("reentrant", 2, Stall::Release), Expect::Holds);
    assert_eq!(expect("reentrant", 1, Stall::Sale), Expect::Breaks);
    for instances in [1, 2] {
        for stall in [Stall::None, Stall::Sale, Stall::Release] {
            assert_eq!(expect("fenced", instances, stall), Expect::Holds);
        }
        // The lock given back before the commit breaks on one instance as
        // on two; the row lock held to the commit holds on both.
        assert_eq!(
            expect("lock_before_commit", instances, Stall::None),
            Expect::Breaks
        );
        assert_eq!(expect("for_update", instances, Stall::None), Expect::Holds);
    }
}

#[test]
fn every_strategy_runs_its_scenarios() {
    assert_eq!(STRATEGIES.len(), 13);
    assert_eq!(stalls("for_update"), [Stall::None]);
    assert_eq!(stalls("lock_before_commit"), [Stall::None]);
    assert_eq!(stalls("redis_lua"), [Stall::None, Stall::Crash]);
    assert_eq!(
        stalls("process_mutex"),
        [Stall::None, Stall::Sale, Stall::Release]
    );
    // One user with two orders fails `for_update`, not `lock_before_commit`.
    let dup = stats(100, 98, 2, 1, 0);
    assert!(row("for_update", 1, Stall::None, dup).failed());
    let broke = row("lock_before_commit", 1, Stall::None, dup);
    assert_eq!(broke.verdict(), "as expected");
}

/// A run's anomalies from its counts, in `Row::anomalies`' order:
/// oversold, undersold, users with two orders, foreign releases, lost.
fn counts(c: [i64; 5]) -> Anomalies {
    let names = [
        "oversold",
        "undersold",
        "users with two orders",
        "foreign releases",
        "lost",
    ];
    std::array::from_fn(|i| (names[i], c[i]))
}

#[test]
fn one_run_reads_as_it_always_did() {
    let naive = counts([144, 0, 118, 0, 0]);
    assert_eq!(
        cell_text(&[naive], 0, Expect::Breaks),
        "**oversold 144, users with two orders 118**"
    );
    assert_eq!(cell_text(&[counts([0; 5])], 0, Expect::Holds), "holds");
    assert_eq!(
        cell_text(&[counts([0; 5])], 0, Expect::Breaks),
        "holds (the race did not happen this run)"
    );
    assert_eq!(
        cell_text(&[counts([0, 0, 1, 0, 0])], 1, Expect::Holds),
        "**users with two orders 1** (FAILED: its design promises better)"
    );
    // A single run's cell is the row's own text.
    let r = row("naive", 1, Stall::None, stats(5, -3, 8, 7, 0));
    assert_eq!(
        cell_text(&[r.anomalies()], 0, r.expected()),
        "**oversold 3, users with two orders 1**"
    );
}

#[test]
fn runs_show_each_anomaly_min_max_or_one_number_when_they_agree() {
    let runs = [
        counts([130, 0, 111, 0, 0]),
        counts([144, 0, 118, 0, 0]),
        counts([138, 0, 118, 0, 0]),
    ];
    assert_eq!(
        cell_text(&runs, 0, Expect::Breaks),
        "**oversold 130-144, users with two orders 111-118**"
    );
    let agree = [counts([0, 0, 50, 50, 0]); 5];
    assert_eq!(
        cell_text(&agree, 0, Expect::Breaks),
        "**users with two orders 50, foreign releases 50**"
    );
    assert_eq!(cell_text(&[counts([0; 5]); 5], 0, Expect::Holds), "holds");
}

#[test]
fn runs_that_disagree_on_whether_it_broke_say_in_how_many_it_did() {
    let runs = [
        counts([0, 0, 3, 0, 0]),
        counts([0; 5]),
        counts([0, 0, 1, 0, 0]),
        counts([0; 5]),
        counts([0; 5]),
    ];
    assert_eq!(
        cell_text(&runs, 0, Expect::Breaks),
        "**users with two orders 0-3 (2 of 5 runs)**"
    );
    // The same count in the runs that broke: still a range from 0.
    let once = [counts([0; 5]), counts([0, 4, 0, 0, 0])];
    assert_eq!(
        cell_text(&once, 0, Expect::Breaks),
        "**undersold 0-4 (1 of 2 runs)**"
    );
    assert_eq!(
        cell_text(&[counts([0; 5]); 5], 0, Expect::Breaks),
        "holds (the race did not happen in any of 5 runs)"
    );
    assert_eq!(
        cell_text(&runs, 2, Expect::Holds),
        "**users with two orders 0-3 (2 of 5 runs)** (FAILED in 2 of 5 runs: its design promises better)"
    );
}

#[test]
fn the_grid_groups_runs_into_cells_and_says_how_many() {
    let mut second = row("naive", 1, Stall::None, stats(5, -1, 6, 6, 0));
    second.run = 2;
    let rows = [
        row("naive", 1, Stall::None, stats(5, -3, 8, 8, 0)),
        second,
        row("fenced", 1, Stall::None, stats(5, 0, 5, 5, 0)),
    ];
    let cells = cells(&rows);
    assert_eq!(cells.len(), 2);
    assert_eq!(cells[0].runs.len(), 2);
    assert_eq!(cells[0].max(Row::oversold), 3);
    assert_eq!(
        cells[0].json()["anomalies"]["oversold"]["runs"],
        json!([3, 1])
    );
    let md = grid(&rows).markdown();
    assert!(
        md.starts_with("| strategy (2 runs per cell, min-max) |"),
        "{md}"
    );
    assert!(md.contains("| `naive` | **oversold 1-3** |"), "{md}");
    assert!(md.contains("| `fenced` | holds |"), "{md}");
    // One run a cell: the header is as it always was.
    assert!(grid(&rows[..1])
        .markdown()
        .starts_with("| strategy | 1 instance, stall: none |"));
}
