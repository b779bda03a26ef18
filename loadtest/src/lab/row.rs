//! One row of the grid: what a run of a cell measured, its anomalies,
//! and its verdict against what LAB.md claims.

use serde_json::{json, Value};

use super::grid::Anomalies;
use super::{expect, redis_stock, Expect, Stall};
use crate::api::LabStats;
use crate::drive::Tally;
use crate::round;

pub struct Row {
    pub strategy: &'static str,
    pub instances: usize,
    pub stall: Stall,
    /// Which run of its cell this row is (1 to `--repeat`).
    pub run: u32,
    /// Users that sent requests in this row.
    pub users: i64,
    pub stats: LabStats,
    pub tally: Tally,
}

impl Row {
    pub fn oversold(&self) -> i64 {
        (self.stats.orders - self.stats.initial_stock).max(0)
    }

    /// Units left unsold while buyers went without: the smaller of the
    /// stock left and the users who got no order.
    pub fn undersold(&self) -> i64 {
        let refused = self.users - self.stats.distinct_users;
        self.stats.stock.max(0).min(refused.max(0))
    }

    pub fn duplicate_users(&self) -> i64 {
        self.stats.orders - self.stats.distinct_users
    }

    /// Units Redis handed out that Postgres holds no order for (the
    /// Redis-stock designs; 0 for the others).
    pub fn lost(&self) -> i64 {
        match self.stats.redis_stock {
            Some(left) if redis_stock(self.strategy) => {
                (self.stats.initial_stock - left - self.stats.orders).max(0)
            }
            _ => 0,
        }
    }

    /// Every anomaly the lab counts, with its count in this row.
    pub fn anomalies(&self) -> Anomalies {
        [
            ("oversold", self.oversold()),
            ("undersold", self.undersold()),
            ("users with two orders", self.duplicate_users()),
            ("foreign releases", self.stats.foreign_releases),
            ("lost", self.lost()),
        ]
    }

    pub fn broke(&self) -> bool {
        self.anomalies().iter().any(|(_, n)| *n > 0)
    }

    pub fn expected(&self) -> Expect {
        expect(self.strategy, self.instances, self.stall)
    }

    /// A row that broke a guarantee its design gives: every design after
    /// `naive` keeps stock right, and the rows LAB.md says hold must hold.
    pub fn failed(&self) -> bool {
        (!["naive", "redis_decr"].contains(&self.strategy) && self.oversold() > 0)
            || (self.expected() == Expect::Holds && self.broke())
    }

    pub(super) fn verdict(&self) -> &'static str {
        match (self.expected(), self.broke()) {
            _ if self.failed() => "FAILED",
            (Expect::Breaks, false) => "race not seen",
            (Expect::Breaks, true) | (Expect::Holds, false) => "as expected",
            (Expect::Nothing, _) => "-",
            (Expect::Holds, true) => unreachable!("a holding row that broke failed"),
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "strategy": self.strategy,
            "instances": self.instances,
            "stall": self.stall.name(),
            "run": self.run,
            "users": self.users,
            "requests": self.tally.requests,
            "status": self.tally.statuses,
            "initial_stock": self.stats.initial_stock,
            "orders": self.stats.orders,
            "stock_left": self.stats.stock,
            "oversold": self.oversold(),
            "undersold": self.undersold(),
            "duplicate_users": self.duplicate_users(),
            "foreign_releases": self.stats.foreign_releases,
            "lost": self.lost(),
            "rps": round(self.tally.rps()),
            "p99_ms": round(self.tally.ms(0.99)),
            "expected": self.expected().name(),
            "verdict": self.verdict(),
        })
    }
}
