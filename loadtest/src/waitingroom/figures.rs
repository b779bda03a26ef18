//! What the run's answers add up to, and what in them breaks the run.

use std::collections::{BTreeMap, HashMap};

use super::room::{End, Kind, Room, Seen};
use super::stats::{slope, spearman};
use crate::drive::{answers_where, Tally};

/// What the run's answers add up to.
pub(super) struct Figures {
    pub rho_early: f64,
    pub early_ranked: usize,
    /// Pre-queue joins that reached the room after the start.
    pub early_late: usize,
    pub rho_later: f64,
    pub later_ranked: usize,
    /// Distinct places each bot held, lowest and highest.
    pub bot_places: Option<(usize, usize)>,
    pub bots_with_one: usize,
    pub bots: usize,
    pub bot_joins: u64,
    /// Users who held more than one place; places held by more than one user.
    users_with_two: usize,
    shared_places: usize,
    pub placed: usize,
    pub rate: f64,
    /// Seconds of readings the rate was fitted over, and their count.
    pub rate_over: (f64, f64),
    pub rate_readings: usize,
    pub admitted: usize,
    pub bought: u64,
    pub probes: BTreeMap<String, u64>,
    pub probe_count: u64,
    pub probe_users: usize,
    pub bought_without: u64,
    pub probes_not_refused: u64,
    pub polls: u64,
    pub polls_mean: f64,
    pub polls_peak: u64,
    pub polls_per_client: f64,
    pub answers: BTreeMap<String, u64>,
    pub ends: BTreeMap<String, u64>,
    pub sold_out_at: Option<f64>,
    pub ran_for: f64,
    queue_5xx: u64,
}

impl Figures {
    pub(super) fn of(
        room: &Room,
        seen: &[Seen],
        buys: &Tally,
        sold_out_at: Option<f64>,
        ran_for: f64,
        probe_users: usize,
    ) -> Self {
        let (early, early_late) = ranked(seen, Kind::Early);
        let (later, _) = ranked(seen, Kind::Later);
        let bots: Vec<&Seen> = seen.iter().filter(|s| s.kind == Kind::Bot).collect();
        let bot_counts: Vec<usize> = bots.iter().map(|s| s.places.len()).collect();
        let holders = holders(seen);
        let pace = pace(room, sold_out_at, holders.len() as i64);
        let rate_over = pace
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (t, _)| {
                (lo.min(*t), hi.max(*t))
            });
        let polls_by_second = room
            .polls_by_second
            .lock()
            .expect("no client panicked")
            .clone();
        let polls: u64 = seen.iter().map(|s| s.polls).sum();
        let probes = room.probes.lock().expect("no client panicked").clone();
        let answers = room.answers.lock().expect("no client panicked").clone();
        Self {
            rho_early: spearman(&early),
            early_ranked: early.len(),
            early_late,
            rho_later: spearman(&later),
            later_ranked: later.len(),
            bot_places: bot_counts
                .iter()
                .min()
                .zip(bot_counts.iter().max())
                .map(|(lo, hi)| (*lo, *hi)),
            bots_with_one: bot_counts.iter().filter(|n| **n == 1).count(),
            bots: bots.len(),
            bot_joins: bots.iter().map(|s| s.joins).sum(),
            users_with_two: seen.iter().filter(|s| s.places.len() > 1).count(),
            shared_places: holders.values().filter(|n| **n > 1).count(),
            placed: holders.len(),
            rate: slope(&pace),
            rate_over,
            rate_readings: pace.len(),
            admitted: seen.iter().filter(|s| s.admitted).count(),
            bought: buys.count("200"),
            probe_count: probes.values().sum(),
            bought_without: answers_where(&probes, |k| k.starts_with('2')),
            probes_not_refused: answers_where(&probes, |k| k != "403 not_admitted"),
            probes,
            probe_users,
            polls,
            polls_mean: polls_by_second.iter().sum::<u64>() as f64
                / polls_by_second.len().max(1) as f64,
            polls_peak: polls_by_second.iter().copied().max().unwrap_or(0),
            polls_per_client: polls as f64 / seen.len().max(1) as f64,
            queue_5xx: answers_where(&answers, |k| {
                k.split(' ').nth(1).is_some_and(|s| s.starts_with('5'))
            }),
            answers,
            ends: ends(seen),
            sold_out_at,
            ran_for,
        }
    }

    /// What breaks the run, as opposed to a goal missed.
    pub(super) fn problems(&self) -> Vec<String> {
        [
            (
                self.bought_without,
                "purchases without an admission succeeded".to_owned(),
            ),
            (
                self.probes_not_refused,
                format!(
                    "purchases without an admission were not answered 403 not_admitted: {:?}",
                    self.probes
                ),
            ),
            (
                self.users_with_two as u64,
                "users held more than one place".to_owned(),
            ),
            (
                self.shared_places as u64,
                "places were given to two users".to_owned(),
            ),
            (self.queue_5xx, "queue answers were 5xx".to_owned()),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect()
    }
}

/// A crowd's (join time, place) pairs to rank, and how many of it reached
/// the room after the start: the pre-queue's late ones are not ranked.
fn ranked(seen: &[Seen], kind: Kind) -> (Vec<(f64, f64)>, usize) {
    let crowd: Vec<&Seen> = seen.iter().filter(|s| s.kind == kind).collect();
    let late = crowd.iter().filter(|s| s.placed_at_join).count();
    let pairs = crowd
        .iter()
        .filter(|s| kind == Kind::Later || !s.placed_at_join)
        .filter_map(|s| Some((s.joined?, s.place? as f64)))
        .collect();
    (pairs, late)
}

/// How many users held each place.
fn holders(seen: &[Seen]) -> HashMap<i64, usize> {
    let mut holders: HashMap<i64, usize> = HashMap::new();
    for s in seen {
        for place in &s.places {
            *holders.entry(*place).or_default() += 1;
        }
    }
    holders
}

/// The pace while units remained: readings up to the first answer that
/// said sold out, and before the room ran out of people.
fn pace(room: &Room, sold_out_at: Option<f64>, placed: i64) -> Vec<(f64, f64)> {
    let readings = room.readings.lock().expect("no client panicked").clone();
    let until = sold_out_at.unwrap_or(f64::INFINITY);
    readings
        .iter()
        .filter(|(t, serving)| *t < until && *serving < placed)
        .map(|(t, serving)| (*t, *serving as f64))
        .collect()
}

/// Clients by how their run ended.
fn ends(seen: &[Seen]) -> BTreeMap<String, u64> {
    let mut ends = BTreeMap::new();
    for s in seen {
        let key = match &s.end {
            End::Bought => "bought".to_owned(),
            End::SoldOutAdmitted => "admitted, sold out".to_owned(),
            End::SoldOut => "sold out while waiting".to_owned(),
            End::Capped => "still waiting at the cap".to_owned(),
            End::Refused(key) => format!("purchase refused: {key}"),
            End::Failed(key) => format!("room failed: {key}"),
        };
        *ends.entry(key).or_default() += 1;
    }
    ends
}
