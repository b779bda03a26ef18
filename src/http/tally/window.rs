//! One voucher's purchase answers, second by second, for the last few
//! seconds: orders, refusals by error code, and a latency histogram with
//! buckets about 19 % apart, from which a p99 is read. Fixed size: a
//! flood adds counts, never memory.

use std::time::Duration;

use super::super::error::ErrorCode;

/// Seconds kept: the p99's window and the last complete second.
pub(in crate::http) const SECONDS: usize = 16;
/// The p99 is read over this many seconds (the current one included).
pub(in crate::http) const P99_SECONDS: u64 = 10;
/// Latency buckets: bucket `i` holds answers up to `FIRST_BOUND * 2^(i/4)`,
/// the last one everything longer.
const BUCKETS: usize = 72;
const FIRST_BOUND_MS: f64 = 0.05;

/// What one purchase answered: an order (`Ok`), or a refusal with its
/// error code (`None`: an answer without one, such as a bare `500`).
pub(super) type Outcome = Result<(), Option<ErrorCode>>;

#[derive(Clone)]
struct Slot {
    /// The second this slot counts (seconds since the monitor began).
    second: u64,
    orders: u64,
    refusals: Vec<(Option<ErrorCode>, u64)>,
    latency: [u32; BUCKETS],
}

impl Slot {
    fn empty(second: u64) -> Self {
        Self {
            second,
            orders: 0,
            refusals: Vec::new(),
            latency: [0; BUCKETS],
        }
    }
}

/// A voucher's last [`SECONDS`] seconds.
pub(super) struct Window {
    slots: Vec<Slot>,
    /// The latest second anything was recorded in.
    pub(super) last: u64,
}

/// A window read at one second.
#[derive(Debug, Default, PartialEq)]
pub(in crate::http) struct Reading {
    /// Orders answered in the last complete second.
    pub(in crate::http) orders_per_second: u64,
    /// Refusals in the last complete second, by error code.
    pub(in crate::http) refusals_per_second: Vec<(Option<ErrorCode>, u64)>,
    /// The 99th percentile of the answers' latency over the last
    /// [`P99_SECONDS`] seconds, in milliseconds (the upper bound of its
    /// bucket); `None` without answers.
    pub(in crate::http) p99_ms: Option<f64>,
    /// Answers the p99 was read from.
    pub(in crate::http) answers: u64,
}

impl Window {
    pub(super) fn new() -> Self {
        Self {
            slots: (0..SECONDS as u64).map(|_| Slot::empty(u64::MAX)).collect(),
            last: 0,
        }
    }

    fn slot(&mut self, second: u64) -> &mut Slot {
        let slot = &mut self.slots[(second % SECONDS as u64) as usize];
        if slot.second != second {
            *slot = Slot::empty(second);
        }
        slot
    }

    /// Counts one answer at `second`, which took `took`.
    pub(super) fn record(&mut self, second: u64, outcome: Outcome, took: Duration) {
        self.last = self.last.max(second);
        let slot = self.slot(second);
        match outcome {
            Ok(()) => slot.orders += 1,
            Err(code) => match slot.refusals.iter_mut().find(|(c, _)| *c == code) {
                Some((_, count)) => *count += 1,
                None => slot.refusals.push((code, 1)),
            },
        }
        slot.latency[bucket(took)] += 1;
    }

    /// The window as it stands at `now` (a second).
    pub(super) fn read(&self, now: u64) -> Reading {
        let counted = |second: u64| {
            self.slots
                .iter()
                .find(|slot| slot.second == second && second <= now)
        };
        let mut reading = Reading::default();
        if let Some(last) = now.checked_sub(1).and_then(counted) {
            reading.orders_per_second = last.orders;
            reading.refusals_per_second = last.refusals.clone();
        }
        let mut latency = [0u64; BUCKETS];
        for second in now.saturating_sub(P99_SECONDS - 1)..=now {
            if let Some(slot) = counted(second) {
                for (sum, count) in latency.iter_mut().zip(slot.latency) {
                    *sum += u64::from(count);
                }
            }
        }
        reading.answers = latency.iter().sum();
        reading.p99_ms = percentile(&latency, reading.answers, 0.99);
        reading
    }
}

/// The bucket of a latency.
fn bucket(took: Duration) -> usize {
    let ms = took.as_secs_f64() * 1000.0;
    if ms <= FIRST_BOUND_MS {
        return 0;
    }
    let index = ((ms / FIRST_BOUND_MS).log2() * 4.0).ceil();
    (index as usize).min(BUCKETS - 1)
}

/// The upper bound of bucket `index`, in milliseconds.
fn bound_ms(index: usize) -> f64 {
    FIRST_BOUND_MS * 2f64.powf(index as f64 / 4.0)
}

/// The bound under which `quantile` of `total` answers fell.
fn percentile(latency: &[u64; BUCKETS], total: u64, quantile: f64) -> Option<f64> {
    if total == 0 {
        return None;
    }
    let rank = ((total as f64) * quantile).ceil() as u64;
    let mut seen = 0;
    for (index, count) in latency.iter().enumerate() {
        seen += count;
        if seen >= rank {
            return Some(bound_ms(index));
        }
    }
    Some(bound_ms(BUCKETS - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn the_rates_are_those_of_the_last_complete_second() {
        let mut window = Window::new();
        for _ in 0..3 {
            window.record(5, Ok(()), ms(2));
        }
        window.record(5, Err(Some(ErrorCode::SoldOut)), ms(1));
        window.record(5, Err(Some(ErrorCode::SoldOut)), ms(1));
        window.record(5, Err(None), ms(1));
        window.record(6, Ok(()), ms(1));
        let reading = window.read(6);
        assert_eq!(reading.orders_per_second, 3);
        assert_eq!(
            reading.refusals_per_second,
            vec![(Some(ErrorCode::SoldOut), 2), (None, 1)]
        );
        // Two seconds on, the second 5 is no longer the last complete one.
        assert_eq!(window.read(8).orders_per_second, 0);
        assert!(window.read(8).refusals_per_second.is_empty());
    }

    #[test]
    fn the_p99_covers_the_last_ten_seconds_and_nothing_older() {
        let mut window = Window::new();
        for _ in 0..99 {
            window.record(20, Ok(()), ms(10));
        }
        window.record(21, Ok(()), ms(1000));
        let p99 = window.read(21).p99_ms.unwrap();
        assert!((10.0..=12.0).contains(&p99), "{p99}");
        window.record(21, Ok(()), ms(1000));
        let p99 = window.read(21).p99_ms.unwrap();
        assert!((1000.0..=1200.0).contains(&p99), "{p99}");
        assert_eq!(window.read(21).answers, 101);
        assert_eq!(window.read(30).answers, 2);
        assert_eq!(window.read(31).p99_ms, None);
    }

    #[test]
    fn a_slot_reused_after_the_window_turned_starts_empty() {
        let mut window = Window::new();
        window.record(1, Ok(()), ms(1));
        window.record(1 + SECONDS as u64, Ok(()), ms(1));
        assert_eq!(window.read(2 + SECONDS as u64).orders_per_second, 1);
        assert_eq!(window.read(2).orders_per_second, 0);
    }

    #[test]
    fn buckets_grow_by_a_fifth_and_hold_their_latency() {
        for took in [ms(0), ms(1), ms(7), ms(250), ms(3000)] {
            let index = bucket(took);
            let upper = bound_ms(index);
            let lower = if index == 0 { 0.0 } else { bound_ms(index - 1) };
            let took_ms = took.as_secs_f64() * 1000.0;
            assert!(lower < took_ms.max(1e-9) && took_ms <= upper, "{took:?}");
        }
        assert_eq!(bucket(Duration::from_secs(3600)), BUCKETS - 1);
    }
}
