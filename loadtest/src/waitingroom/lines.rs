//! The run's table: each figure as a line, with its goal if it has one.

use serde_json::{json, Value};

use super::cost::PollCost;
use super::figures::Figures;
use super::WaitingRoomArgs;
use crate::invariants::Check;
use crate::round3;
use crate::table::Table;

/// One line of the run's table: a figure, and its goal if it has one.
pub(super) struct Line {
    measure: String,
    pub measured: String,
    pub goal: &'static str,
    /// `None`: no goal, or not measured in this run.
    met: Option<bool>,
}

impl Line {
    fn fact(measure: impl Into<String>, measured: impl Into<String>) -> Self {
        Self {
            measure: measure.into(),
            measured: measured.into(),
            goal: "",
            met: None,
        }
    }

    fn goal(
        measure: impl Into<String>,
        measured: impl Into<String>,
        goal: &'static str,
        met: Option<bool>,
    ) -> Self {
        Self {
            measure: measure.into(),
            measured: measured.into(),
            goal,
            met,
        }
    }

    pub(super) fn json(&self) -> Value {
        json!({
            "measure": self.measure,
            "measured": self.measured,
            "goal": self.goal,
            "met": self.met,
        })
    }
}

/// `met` of a figure that may not have been measured (NaN).
fn judged(figure: f64, met: impl Fn(f64) -> bool) -> Option<bool> {
    (!figure.is_nan()).then(|| met(figure))
}

/// Thousands separated by commas.
pub(super) fn thousands(n: impl Into<i128>) -> String {
    let n: i128 = n.into();
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

impl Figures {
    pub(super) fn lines(
        &self,
        args: &WaitingRoomArgs,
        cost: Option<&PollCost>,
        check: &Check,
    ) -> Vec<Line> {
        let mut lines = self.fairness(args);
        lines.extend(self.pace(args));
        if let Some(cost) = cost {
            lines.push(cost_line(cost, args));
        }
        lines.extend(self.outcome(args, check));
        lines
    }

    /// Who joined, and whether the room placed them fairly.
    fn fairness(&self, args: &WaitingRoomArgs) -> Vec<Line> {
        vec![
            Line::fact(
                "clients: pre-queue, later, bots",
                format!(
                    "{}, {}, {}",
                    thousands(args.prequeue),
                    thousands(args.later),
                    thousands(args.bots)
                ),
            ),
            rho_line(
                "pre-queue",
                self.early_ranked,
                self.rho_early,
                "|ρ| <= 0.05",
                |r| r.abs() <= 0.05,
            ),
            rho_line("later", self.later_ranked, self.rho_later, ">= 0.99", |r| {
                r >= 0.99
            }),
            Line::goal(
                format!(
                    "places held per bot ({} bots, {} joins)",
                    self.bots,
                    thousands(self.bot_joins as i64)
                ),
                match self.bot_places {
                    Some((lo, hi)) if lo == hi => format!("{lo} (every bot)"),
                    Some((lo, hi)) => format!("{lo} to {hi} ({} bots with 1)", self.bots_with_one),
                    None => "-".to_owned(),
                },
                "1",
                self.bot_places.map(|(lo, hi)| lo == 1 && hi == 1),
            ),
        ]
    }

    /// How fast the room admitted, that it admitted everyone who bought,
    /// and the polls it took.
    fn pace(&self, args: &WaitingRoomArgs) -> Vec<Line> {
        let rate_ratio = self.rate / args.admit_per_second as f64;
        vec![
            Line::goal(
                if self.rate_readings == 0 {
                    "admitted/s while units remained (no readings of serving)".to_owned()
                } else {
                    format!(
                        "admitted/s while units remained ({} readings of serving, {:.1} to {:.1} s after the start)",
                        thousands(self.rate_readings as i64),
                        self.rate_over.0,
                        self.rate_over.1
                    )
                },
                format!(
                    "{:.1} ({:.3} of {})",
                    self.rate, rate_ratio, args.admit_per_second
                ),
                "within 5 %",
                judged(rate_ratio, |r| (r - 1.0).abs() <= 0.05),
            ),
            Line::goal(
                format!(
                    "purchases without an admission that succeeded ({} tries by {} users)",
                    thousands(self.probe_count as i64),
                    self.probe_users
                ),
                format!(
                    "{} ({} answered 403 not_admitted)",
                    self.bought_without,
                    thousands(self.probes.get("403 not_admitted").copied().unwrap_or(0) as i64)
                ),
                "0",
                Some(self.bought_without == 0 && self.probes_not_refused == 0),
            ),
            Line::fact(
                "polls/s the service received: mean, peak second",
                format!(
                    "{}, {} ({} polls, {:.1} per client)",
                    thousands(self.polls_mean.round() as i64),
                    thousands(self.polls_peak as i64),
                    thousands(self.polls as i64),
                    self.polls_per_client
                ),
            ),
        ]
    }

    /// What was sold, when, and whether the sale's invariants held.
    fn outcome(&self, args: &WaitingRoomArgs, check: &Check) -> Vec<Line> {
        let mut lines = vec![
            Line::fact(
                "admitted, bought, units",
                format!(
                    "{}, {}, {}",
                    thousands(self.admitted as i64),
                    thousands(self.bought as i64),
                    thousands(args.stock)
                ),
            ),
            Line::fact(
                "sold out, room done (s after the start)",
                format!(
                    "{}, {:.1}",
                    self.sold_out_at
                        .map_or("never".to_owned(), |t| format!("{t:.1}")),
                    self.ran_for
                ),
            ),
        ];
        if self.early_late > 0 {
            lines.push(Line::fact(
                "pre-queue joins that reached the room after the start (not ranked)",
                thousands(self.early_late as i64),
            ));
        }
        lines.push(Line::goal(
            format!(
                "invariants ({} orders, {} places handed out)",
                thousands(check.orders),
                thousands(self.placed as i64)
            ),
            if check.ok() { "ok" } else { "BROKEN" }.to_owned(),
            "ok",
            Some(check.ok()),
        ));
        lines
    }
}

/// How a crowd's places follow its join times: ρ over its `ranked`
/// joiners, judged by `met`.
fn rho_line(
    crowd: &str,
    ranked: usize,
    rho: f64,
    goal: &'static str,
    met: fn(f64) -> bool,
) -> Line {
    Line::goal(
        format!(
            "ρ(join time, place), {crowd} joiners ({})",
            thousands(ranked as i64)
        ),
        format!("{rho:.4}"),
        goal,
        judged(rho, met),
    )
}

/// A poll's CPU beside `/healthz`'s.
fn cost_line(cost: &PollCost, args: &WaitingRoomArgs) -> Line {
    Line::goal(
        format!(
            "service CPU per poll / per /healthz ({} each, {} connections)",
            thousands(cost.polls as i64),
            args.connections
        ),
        format!(
            "{:.2}x ({:.1} / {:.1} µs; {} polls/s, {} /healthz/s)",
            cost.ratio(),
            cost.poll_us,
            cost.healthz_us,
            thousands(cost.polls_per_second.round() as i64),
            thousands(cost.healthz_per_second.round() as i64)
        ),
        "<= 2x",
        judged(cost.ratio(), |r| r <= 2.0),
    )
}

pub(super) fn print_lines(lines: &[Line]) {
    let mut table = Table::new(["measure", "measured", "goal", "met"]);
    for line in lines {
        table.row([
            line.measure.clone(),
            line.measured.clone(),
            if line.goal.is_empty() { "-" } else { line.goal }.to_owned(),
            match (line.goal.is_empty(), line.met) {
                (true, _) => "-",
                (false, None) => "not measured",
                (false, Some(true)) => "yes",
                (false, Some(false)) => "NO",
            }
            .to_owned(),
        ]);
    }
    print!("{}", table.text());
    crate::table::record("waitingroom", "The room under its crowd", &table);
}

/// A figure for the JSON line: null when it was not measured.
pub(super) fn finite(x: f64) -> Option<f64> {
    x.is_finite().then(|| round3(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(20_000), "20,000");
        assert_eq!(thousands(-1_234_567), "-1,234,567");
    }
}
