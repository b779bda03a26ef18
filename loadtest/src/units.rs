//! Units in a crowd: `--quantity 1-3` gives each user an ask of its own in
//! that range, and [`check`] judges the run in units: every order holds
//! exactly its user's ask (nobody served part of one), and the crowd sold
//! out to the unit when it asked for more than the stock.

use std::str::FromStr;
use std::sync::Arc;

use crate::api::Admin;
use crate::drive::Request;
use crate::service::Target;

/// The units each user of a crowd asks for: one number, or a range `a-b`
/// (1 to 100), dealt to users by their id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantities {
    low: i64,
    high: i64,
}

impl Default for Quantities {
    fn default() -> Self {
        Self { low: 1, high: 1 }
    }
}

impl FromStr for Quantities {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let number = |part: &str| {
            part.trim()
                .parse::<i64>()
                .ok()
                .filter(|n| (1..=100).contains(n))
                .ok_or_else(|| format!("{part:?} is not a quantity of 1 to 100"))
        };
        let (low, high) = match text.split_once('-') {
            Some((low, high)) => (number(low)?, number(high)?),
            None => (number(text)?, number(text)?),
        };
        if low > high {
            return Err(format!("{text}: the range runs from low to high"));
        }
        Ok(Self { low, high })
    }
}

impl Quantities {
    /// What user `user` asks for: spread evenly over the range by id.
    pub fn ask(&self, user: i64) -> i64 {
        let span = self.high - self.low + 1;
        // A multiplicative hash: neighbouring ids ask for different units.
        let mixed = (user as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        self.low + (mixed % span as u64) as i64
    }

    /// [`Target::purchases`] of `voucher`, `per_user` for each of `tokens`
    /// (the users from `first_user` on, in order), each asking for its
    /// user's units.
    pub fn purchases(
        &self,
        target: &Target,
        voucher: i64,
        tokens: &[Arc<str>],
        first_user: i64,
        per_user: usize,
    ) -> Vec<Request> {
        let per_user = per_user.max(1);
        target
            .purchases(voucher, tokens, per_user)
            .into_iter()
            .enumerate()
            .map(|(i, request)| request.asking(self.ask(first_user + (i / per_user) as i64)))
            .collect()
    }

    /// Whether every user asks for one unit: the crowd of before units.
    pub fn ones(&self) -> bool {
        self.high == 1
    }

    /// The largest ask.
    pub fn high(&self) -> i64 {
        self.high
    }
}

impl std::fmt::Display for Quantities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.low == self.high {
            write!(f, "{}", self.low)
        } else {
            write!(f, "{}-{}", self.low, self.high)
        }
    }
}

/// The problems of a run whose users `users` asked by `quantities` for a
/// voucher of `initial` units: an order that holds other than its user's
/// ask, and units left that some refused ask would have fit.
pub(crate) async fn check(
    admin: &Admin,
    voucher: i64,
    quantities: Quantities,
    users: std::ops::Range<i64>,
    initial: i64,
) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    let lines = admin.order_lines(voucher).await?;
    let live = lines.iter().filter(|line| line.is_live());
    let mut sold = 0;
    for line in live {
        sold += line.quantity;
        let asked = quantities.ask(line.user_id);
        if line.quantity != asked {
            problems.push(format!(
                "order {} holds {} units; its user asked for {asked}",
                line.order_id, line.quantity
            ));
        }
    }
    let demand: i64 = users.map(|user| quantities.ask(user)).sum();
    let left = initial - sold;
    if demand > initial && left >= quantities.high() {
        problems.push(format!(
            "{left} units left unsold, though every ask is at most {} and {demand} were asked for",
            quantities.high()
        ));
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantity_is_a_number_or_a_range_of_one_to_a_hundred() {
        assert_eq!("2".parse(), Ok(Quantities { low: 2, high: 2 }));
        assert_eq!("1-3".parse(), Ok(Quantities { low: 1, high: 3 }));
        for bad in ["0", "101", "3-1", "1-", "x", "-2", ""] {
            assert!(bad.parse::<Quantities>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_ask_is_in_the_range_and_a_crowd_asks_for_each_quantity() {
        let range: Quantities = "1-3".parse().unwrap();
        let mut seen = [0; 4];
        for user in 1..=3_000 {
            let ask = range.ask(user);
            assert!((1..=3).contains(&ask), "{ask}");
            seen[ask as usize] += 1;
        }
        for (units, count) in seen.iter().enumerate().skip(1) {
            assert!(*count > 800, "{count} users asked for {units}");
        }
        assert!(Quantities::default().ones());
        assert!((1..100).all(|user| Quantities::default().ask(user) == 1));
    }
}
