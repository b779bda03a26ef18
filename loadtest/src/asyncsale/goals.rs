//! The goals, each measured and judged, as a table and as JSON.

use serde_json::{json, Value};

use crate::table::Table;

/// One of the goals, measured in this run.
pub(crate) struct Goal {
    pub measure: &'static str,
    pub measured: f64,
    pub goal: &'static str,
    pub met: bool,
}

impl Goal {
    /// Whether the goal was met; `None` when its figure could not be
    /// measured in this run (NaN), which judges nothing.
    fn verdict(&self) -> Option<bool> {
        (!self.measured.is_nan()).then_some(self.met)
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "measure": self.measure,
            "measured": self.measured,
            "goal": self.goal,
            "met": self.verdict(),
        })
    }
}

/// Prints the goals judged, and records them under the guide's page `page`.
pub(crate) fn print_goals(page: &str, goals: &[Goal]) {
    let mut table = Table::new(["goal", "measured", "target", "met"]);
    for g in goals {
        table.row([
            g.measure.to_owned(),
            match g.verdict() {
                None => "not measured".to_owned(),
                Some(_) => g.measured.to_string(),
            },
            g.goal.to_owned(),
            match g.verdict() {
                None => "-",
                Some(true) => "yes",
                Some(false) => "NO",
            }
            .to_owned(),
        ]);
    }
    eprint!("{}", table.text());
    crate::table::record(page, "Goals", &table);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_goal_not_measured_is_not_judged() {
        let goal = |measured: f64, met: bool| Goal {
            measure: "m",
            measured,
            goal: "<= 1",
            met,
        };
        assert_eq!(goal(f64::NAN, false).verdict(), None);
        assert_eq!(goal(f64::NAN, false).json()["met"], Value::Null);
        assert_eq!(goal(0.5, true).json()["met"], json!(true));
        assert_eq!(goal(2.0, false).json()["met"], json!(false));
    }
}
