//! The accepted -> confirmed histogram the writers record, read off
//! every instance's `/metrics`.

use super::CONFIRM_METRIC;
use crate::scrape::metrics_text;
use crate::service::Target;

/// A Prometheus histogram's cumulative buckets, summed over instances.
#[derive(Default)]
pub(super) struct Histogram {
    /// (upper bound, cumulative count), ascending; `+Inf` last.
    buckets: Vec<(f64, f64)>,
    pub count: f64,
}

impl Histogram {
    /// The observations made between `earlier` and this one.
    pub(super) fn since(&self, earlier: &Histogram) -> Histogram {
        let before = |le: f64| {
            earlier
                .buckets
                .iter()
                .find(|(bound, _)| *bound == le)
                .map_or(0.0, |(_, n)| *n)
        };
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, n)| (*le, n - before(*le)))
                .collect(),
            count: self.count - earlier.count,
        }
    }

    /// The smallest bucket bound below which `q` of the observations fall.
    pub(super) fn quantile_bound(&self, q: f64) -> Option<f64> {
        (self.count > 0.0).then_some(())?;
        self.buckets
            .iter()
            .find(|(_, n)| *n >= q * self.count)
            .map(|(le, _)| *le)
    }

    /// The share of observations at or below `bound` (a bucket bound).
    pub(super) fn share_within(&self, bound: f64) -> Option<f64> {
        (self.count > 0.0).then_some(())?;
        self.buckets
            .iter()
            .find(|(le, _)| *le == bound)
            .map(|(_, n)| n / self.count)
    }
}

/// Reads [`CONFIRM_METRIC`] off every instance's `/metrics`.
pub(super) async fn confirm_histogram(target: &Target) -> anyhow::Result<Histogram> {
    let mut total = Histogram::default();
    for base in &target.bases {
        let one = parse_histogram(&metrics_text(base).await?, CONFIRM_METRIC);
        for (le, n) in one.buckets {
            match total.buckets.iter_mut().find(|(bound, _)| *bound == le) {
                Some((_, sum)) => *sum += n,
                None => total.buckets.push((le, n)),
            }
        }
        total.count += one.count;
    }
    total.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(total)
}

/// `name`'s buckets and count in Prometheus text (empty when absent: no
/// observation yet).
fn parse_histogram(text: &str, name: &str) -> Histogram {
    let (bucket, count) = (format!("{name}_bucket"), format!("{name}_count"));
    let mut histogram = Histogram::default();
    for (labels, value) in crate::scrape::series(text, &bucket) {
        let le = labels
            .split("le=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .and_then(|le| match le {
                "+Inf" => Some(f64::INFINITY),
                le => le.parse::<f64>().ok(),
            });
        if let Some(le) = le {
            histogram.buckets.push((le, value));
        }
    }
    histogram.count = crate::scrape::sum_of(text, &count);
    histogram
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = "\
# TYPE seckill_async_confirm_seconds histogram
seckill_async_confirm_seconds_bucket{le=\"0.01\"} 10
seckill_async_confirm_seconds_bucket{le=\"0.1\"} 95
seckill_async_confirm_seconds_bucket{le=\"1\"} 99
seckill_async_confirm_seconds_bucket{le=\"+Inf\"} 100
seckill_async_confirm_seconds_sum 12.5
seckill_async_confirm_seconds_count 100
seckill_sale_commit_seconds_count 7
";

    #[test]
    fn a_histogram_is_read_from_prometheus_text() {
        let h = parse_histogram(EXPOSITION, CONFIRM_METRIC);
        assert_eq!(h.count, 100.0);
        assert_eq!(
            h.buckets,
            vec![
                (0.01, 10.0),
                (0.1, 95.0),
                (1.0, 99.0),
                (f64::INFINITY, 100.0)
            ]
        );
        assert_eq!(h.quantile_bound(0.5), Some(0.1));
        assert_eq!(h.quantile_bound(0.99), Some(1.0));
        assert_eq!(h.share_within(1.0), Some(0.99));
        assert!(parse_histogram("", CONFIRM_METRIC)
            .quantile_bound(0.99)
            .is_none());
    }

    #[test]
    fn only_the_observations_of_the_run_count() {
        let before = parse_histogram(EXPOSITION, CONFIRM_METRIC);
        let after = parse_histogram(
            &EXPOSITION
                .replace("} 99\n", "} 199\n")
                .replace("} 100\n", "} 200\n")
                .replace("_count 100", "_count 200"),
            CONFIRM_METRIC,
        );
        let run = after.since(&before);
        assert_eq!(run.count, 100.0);
        // The run's 100 observations all fell between 0.1 and 1 s.
        assert_eq!(run.quantile_bound(0.5), Some(1.0));
        assert_eq!(run.share_within(0.1), Some(0.0));
    }
}
