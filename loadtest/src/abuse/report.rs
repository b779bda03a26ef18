//! The rows' tables, their goals judged, and each row's JSON.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::cost::{print_cost, RefusalCost};
use super::row::{Alone, Row};
use super::slow::Slow;
use super::{AbuseArgs, Attack};
use crate::drive::answers_where;
use crate::table::Table;
use crate::{report, round};

/// One of the goals for one row.
pub(super) struct Verdict {
    /// The row it judges.
    pub row: &'static str,
    pub goal: &'static str,
    pub measured: f64,
    pub target: &'static str,
    /// `None`: not measured in this run (no limit set, say).
    met: Option<bool>,
}

impl Verdict {
    pub(super) fn new(
        row: &'static str,
        goal: &'static str,
        measured: f64,
        target: &'static str,
        met: impl Fn(f64) -> bool,
    ) -> Self {
        Self {
            row,
            goal,
            measured,
            target,
            met: (!measured.is_nan()).then(|| met(measured)),
        }
    }

    pub(super) fn json(&self) -> Value {
        json!({
            "goal": self.goal,
            "measured": if self.measured.is_nan() { Value::Null } else { json!(round(self.measured)) },
            "target": self.target,
            "met": self.met,
        })
    }
}

/// Prints the rows' tables, their goals and what failed, saves the HTML
/// report and prints the JSON line; whether every row held.
pub(super) fn finish(args: &AbuseArgs, rows: &[Row], cost: Option<&RefusalCost>) -> bool {
    let alone = &Alone::of(rows);
    let goals: Vec<Verdict> = rows
        .iter()
        .flat_map(|row| goals(row, alone))
        .chain(front_goals(rows, alone))
        .chain(cost.map(RefusalCost::verdicts).into_iter().flatten())
        .collect();
    print_rows(rows, alone);
    print_goals(&goals);
    if let Some(cost) = cost {
        print_cost(cost);
    }
    print_failures(rows);
    save(rows, alone);
    let ok = rows.iter().all(|r| r.check.ok() && r.honest_5xx() == 0);
    println!(
        "{}",
        json!({
            "scenario": "abuse",
            "ok": ok,
            "seconds": args.seconds,
            "instances": args.instances.max(1),
            "connections": args.connections,
            "attack_connections": args.attack_connections,
            "limit_per_address": args.limit_per_address,
            "limit_per_user": args.limit_per_user,
            "body_timeout_ms": args.body_timeout_ms,
            "limit_delay_ms": args.limit_delay_ms,
            "rows": rows.iter().map(|r| row_json(r, alone)).collect::<Vec<_>>(),
            "refusal_cost": cost.map(RefusalCost::json),
        })
    );
    ok
}

fn print_failures(rows: &[Row]) {
    for row in rows {
        for problem in &row.check.problems {
            println!("  {}: INVARIANT BROKEN: {problem}", row.name());
        }
        if row.honest_5xx() > 0 {
            println!(
                "  {}: FAILED: {} honest purchases answered 5xx",
                row.name(),
                row.honest_5xx()
            );
        }
    }
}

/// The HTML report: a section of the honest crowd beside each attacker.
fn save(rows: &[Row], alone: &Alone) {
    let sections: Vec<report::Section> = rows
        .iter()
        .map(|row| report::Section {
            title: format!("honest buyers beside: {}", row.name()),
            tally: &row.honest,
            facts: vec![
                ("purchases/s".into(), format!("{:.0}", row.rate)),
                ("p99 ms".into(), format!("{:.2}", row.honest.ms(0.99))),
                ("answers".into(), statuses(&row.honest.statuses)),
                (
                    "attacker".into(),
                    row.attacker
                        .as_ref()
                        .map_or("-".into(), |t| statuses(&t.statuses)),
                ),
            ],
            ceilings: None,
        })
        .collect();
    report::save(
        "abuse",
        &report::html(
            "seckill load test: abuse",
            &sections,
            &[("Rows", rows_table(rows, alone).html())],
            &[],
        ),
    );
}

/// The goals of the rows through the front, on the median of their rounds
/// (each against the crowd alone through the front just before it): the
/// buyers keep 0.9 of their rate, their p99 under 2x.
fn front_goals(rows: &[Row], alone: &Alone) -> Vec<Verdict> {
    let beside: Vec<&Row> = rows
        .iter()
        .filter(|r| r.attack == Attack::FrontBotnetReads)
        .collect();
    if beside.is_empty() {
        return Vec::new();
    }
    let median = |of: &dyn Fn(&Row) -> f64| crate::median(beside.iter().map(|r| of(r)).collect());
    let name = Attack::FrontBotnetReads.name();
    vec![
        Verdict::new(
            name,
            "honest purchases/s, of alone through the front (median of the rounds)",
            median(&|r| r.rate / alone.rate_for(r)),
            ">= 0.9",
            |m| m >= 0.9,
        ),
        Verdict::new(
            name,
            "honest p99, of alone through the front (median of the rounds)",
            median(&|r| r.honest.ms(0.99) / alone.p99_for(r)),
            "< 2",
            |m| m < 2.0,
        ),
    ]
}

/// The goals for one row.
fn goals(row: &Row, alone: &Alone) -> Vec<Verdict> {
    let attack = row.name();
    let mut goals = Vec::new();
    // The rows through the front are judged together (`front_goals`).
    if !matches!(
        row.attack,
        Attack::Nobody | Attack::FrontAlone | Attack::FrontBotnetReads
    ) {
        // The botnets' issue asks more of the buyers' rate: 0.8 straight
        // at the instance.
        let (least, text) = match row.attack {
            Attack::BotnetReads | Attack::BotnetAccounts => (0.8, ">= 0.8"),
            _ => (0.6, ">= 0.6"),
        };
        goals.push(Verdict::new(
            attack,
            "honest purchases/s, of alone",
            row.rate / alone.rate_for(row),
            text,
            move |m| m >= least,
        ));
        goals.push(Verdict::new(
            attack,
            "honest p99, of alone",
            row.honest.ms(0.99) / alone.p99_for(row),
            "< 2",
            |m| m < 2.0,
        ));
    }
    if let Some(reads) = row.origin_reads {
        goals.push(Verdict::new(
            attack,
            "reads reaching the instance, per voucher and second",
            reads,
            "<= 5",
            |m| m <= 5.0,
        ));
    }
    goals.push(Verdict::new(
        attack,
        "honest answers 5xx (503 included)",
        row.honest_5xx() as f64,
        "0",
        |m| m == 0.0,
    ));
    if let Some(attacker) = row.attacker.as_ref().filter(|_| row.allowance.is_some()) {
        let refused = answers_where(&attacker.statuses, |k| k.starts_with("429"));
        let other = attacker.requests - refused;
        goals.push(Verdict::new(
            attack,
            "attacker's answers other than 429, of its limit's allowance",
            row.allowance.map_or(f64::NAN, |a| other as f64 / a),
            "<= 1",
            |m| m <= 1.0,
        ));
    }
    if let Some(slow) = &row.slow {
        goals.push(Verdict::new(
            attack,
            "slow connections not ended within deadline + 1 s",
            (slow.conns.len() - slow.in_time()) as f64,
            "0",
            |m| m == 0.0,
        ));
    }
    goals
}

/// `200 5123, 429 rate_limited 12`: a tally's answers, compactly.
pub(super) fn statuses(statuses: &BTreeMap<String, u64>) -> String {
    if statuses.is_empty() {
        return "-".into();
    }
    statuses
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn rows_table(rows: &[Row], alone: &Alone) -> Table {
    let mut table = Table::new([
        "attacker",
        "honest buys/s",
        "of alone",
        "honest p99 ms",
        "p99 of alone",
        "honest answers",
        "attacker answers/s",
        "attacker answers",
        "service CPU %",
        "driver CPU %",
        "front CPU %",
        "bots' process CPU %",
        "all CPU %",
        "invariants",
    ]);
    for row in rows {
        let (attacker_rate, attacker_answers) = match (&row.attacker, &row.slow) {
            (Some(t), _) => (format!("{:.0}", t.rps()), statuses(&t.statuses)),
            (None, Some(slow)) => ("-".into(), statuses(&slow.ends())),
            (None, None) => ("-".into(), "-".into()),
        };
        let percent = |part| {
            row.cpu
                .get(part)
                .map_or("-".to_owned(), |p| format!("{p:.0}"))
        };
        table.row([
            row.name().to_owned(),
            format!("{:.0}", row.rate),
            format!("{:.2}", row.rate / alone.rate_for(row)),
            format!("{:.2}", row.honest.ms(0.99)),
            format!("{:.2}", row.honest.ms(0.99) / alone.p99_for(row)),
            statuses(&row.honest.statuses),
            attacker_rate,
            attacker_answers,
            percent("service"),
            percent("driver"),
            percent("front"),
            percent("flood"),
            format!("{:.0}", row.cpu.values().sum::<f64>()),
            if row.check.ok() && row.honest_5xx() == 0 {
                "ok"
            } else {
                "FAILED"
            }
            .to_owned(),
        ]);
    }
    table
}

fn print_rows(rows: &[Row], alone: &Alone) {
    let table = rows_table(rows, alone);
    print!("{}", table.text());
    crate::table::record("abuse", "Honest buyers beside each attacker", &table);
    for row in rows {
        if row.honest.exhausted {
            println!(
                "  {}: every honest buyer bought before the row's time was up (more --users would have kept them buying)",
                row.name()
            );
        }
        let Some(slow) = &row.slow else { continue };
        let mut table = Table::new([
            "slow connections",
            "deadline s",
            "ended in time",
            "first s",
            "median s",
            "last s",
            "how they ended",
        ]);
        let after = slow.after();
        let at = |pick: fn((f64, f64, f64)) -> f64| {
            after.map_or("-".into(), |a| format!("{:.2}", pick(a)))
        };
        table.row([
            slow.conns.len().to_string(),
            format!("{:.1}", slow.deadline.as_secs_f64()),
            slow.in_time().to_string(),
            at(|a| a.0),
            at(|a| a.1),
            at(|a| a.2),
            statuses(&slow.ends()),
        ]);
        print!("\n{}", table.text());
        crate::table::record("abuse", "Slow bodies: when the server ended them", &table);
    }
}

fn print_goals(goals: &[Verdict]) {
    let mut table = Table::new(["attacker", "goal", "measured", "target", "met"]);
    for g in goals {
        table.row([
            g.row.to_owned(),
            g.goal.to_owned(),
            if g.measured.is_nan() {
                "not measured".to_owned()
            } else {
                format!("{}", round(g.measured))
            },
            g.target.to_owned(),
            match g.met {
                None => "-",
                Some(true) => "yes",
                Some(false) => "NO",
            }
            .to_owned(),
        ]);
    }
    print!("\n{}", table.text());
    crate::table::record("abuse", "Goals", &table);
}

fn row_json(row: &Row, alone: &Alone) -> Value {
    json!({
        "attacker": row.name(),
        "honest": {
            "requests": row.honest.requests,
            "purchases_per_sec": round(row.rate),
            "of_alone": round(row.rate / alone.rate_for(row)),
            "p50_ms": round(row.honest.ms(0.5)),
            "p99_ms": round(row.honest.ms(0.99)),
            "p99_of_alone": round(row.honest.ms(0.99) / alone.p99_for(row)),
            "status": row.honest.statuses,
            "users_ran_out": row.honest.exhausted,
            "seconds": round(row.honest.elapsed.as_secs_f64()),
        },
        "origin_reads_per_voucher_second": row.origin_reads.map(round),
        "attack": row.attacker.as_ref().map(|t| json!({
            "requests": t.requests,
            "answers_per_sec": round(t.rps()),
            "status": t.statuses,
            "allowance": row.allowance.map(round),
            "seconds": round(t.elapsed.as_secs_f64()),
        })),
        "slow": row.slow.as_ref().map(Slow::json),
        "cpu_percent_of_a_core": row.cpu,
        "queueing_delay_ms": { "mean": round(row.delay_ms.0), "highest": round(row.delay_ms.1) },
        "orders": row.check.orders,
        "invariants_ok": row.check.ok(),
        "problems": row.check.problems,
        "goals": goals(row, alone).iter().map(Verdict::json).collect::<Vec<_>>(),
    })
}
