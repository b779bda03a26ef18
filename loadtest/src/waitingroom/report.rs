//! The run's report: its tables, the lines that say what failed, and the
//! JSON line last.

use serde_json::json;

use super::cost::PollCost;
use super::figures::Figures;
use super::lines::{finite, print_lines, Line};
use super::proof::{print_proofs, Proof, ProofCheck};
use super::WaitingRoomArgs;
use crate::drive::Tally;
use crate::invariants::Check;
use crate::round3;

/// Everything the run measured.
pub(super) struct Outcome {
    pub voucher: i64,
    pub instances: usize,
    pub figures: Figures,
    pub lines: Vec<Line>,
    pub buys: Tally,
    pub sold_out_at: Option<f64>,
    pub invariants: Check,
    pub cost: Option<PollCost>,
    pub proof_check: ProofCheck,
    pub proofs: Vec<Proof>,
}

impl Outcome {
    /// Prints the tables, what failed and the JSON line; whether all held.
    pub fn print(&self, args: &WaitingRoomArgs) -> bool {
        let mut problems = self.invariants.problems.clone();
        problems.extend(self.figures.problems());
        if !self.proof_check.ok() {
            problems.push(format!(
                "a join with proof of work ({} bits) was answered {} (without proof: {}, another user's: {})",
                self.proof_check.bits,
                self.proof_check.with,
                self.proof_check.without,
                self.proof_check.others.as_deref().unwrap_or("-")
            ));
        }
        print_lines(&self.lines);
        print_proofs(&self.proofs, &self.proof_check);
        println!("  queue answers: {:?}", self.figures.answers);
        println!("  purchases: {:?}", self.buys.statuses);
        println!("  probes: {:?}", self.figures.probes);
        println!("  clients' ends: {:?}", self.figures.ends);
        if let Some(cost) = &self.cost {
            if !cost.refused.is_empty() {
                println!("  CPU phase polls not answered 200: {:?}", cost.refused);
            }
        }
        for problem in &problems {
            println!("  FAILED: {problem}");
        }
        self.print_json(args, &problems);
        problems.is_empty()
    }

    fn print_json(&self, args: &WaitingRoomArgs, problems: &[String]) {
        let ok = problems.is_empty();
        println!(
            "{}",
            json!({
                "scenario": "waitingroom",
                "voucher": self.voucher,
                "prequeue": args.prequeue,
                "later": args.later,
                "bots": args.bots,
                "admit_per_second": args.admit_per_second,
                "stock": args.stock,
                "instances": self.instances,
                "orders": self.invariants.orders,
                "invariants_ok": self.invariants.ok(),
                "problems": problems,
                "rho_prequeue": finite(self.figures.rho_early),
                "rho_later": finite(self.figures.rho_later),
                "bot_places": self.figures.bot_places,
                "admitted_per_second": finite(self.figures.rate),
                "sold_out_after_s": self.sold_out_at.map(round3),
                "bought_without_admission": self.figures.bought_without,
                "probes": self.figures.probes,
                "polls": self.figures.polls,
                "polls_per_second_mean": round3(self.figures.polls_mean),
                "polls_per_second_peak": self.figures.polls_peak,
                "poll_cpu_us": self.cost.as_ref().map(|c| round3(c.poll_us)),
                "healthz_cpu_us": self.cost.as_ref().map(|c| round3(c.healthz_us)),
                "healthz_cpu_us_runs": self.cost.as_ref().map(|c| c.healthz_runs_us.map(round3)),
                "poll_cpu_ratio": self.cost.as_ref().map(|c| finite(c.ratio())),
                "proof_of_work": self.proofs.iter().map(|p| json!({
                    "bits": p.bits, "solved": p.solved,
                    "mean_hashes": round3(p.mean_hashes), "mean_ms": round3(p.mean_ms),
                    "max_ms": round3(p.max_ms), "expected_ms": round3(p.expected_ms),
                })).collect::<Vec<_>>(),
                "proof_join_ok": self.proof_check.ok(),
                "queue_answers": self.figures.answers,
                "purchases": self.buys.statuses,
                "ends": self.figures.ends,
                "lines": self.lines.iter().map(Line::json).collect::<Vec<_>>(),
                "ok": ok,
            })
        );
    }
}
