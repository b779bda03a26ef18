//! What a running instance's `/metrics` page says: its text, a metric's
//! series, and a counter's or gauge's value summed over them.

use std::time::Duration;

use anyhow::Context;

/// A counter's or gauge's value on the instance at `base`.
pub(crate) async fn metric_sum(base: &str, name: &str) -> anyhow::Result<f64> {
    Ok(sum_of(&metrics_text(base).await?, name))
}

/// `name`'s value in Prometheus text, summed over its series (0 before
/// its first change: the exporter shows it only then).
pub(crate) fn sum_of(text: &str, name: &str) -> f64 {
    series(text, name).map(|(_, value)| value).sum()
}

/// `name`'s series in Prometheus text: each one's labels (`{...}`, or
/// empty) and value.
pub(crate) fn series<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        if !rest.starts_with([' ', '{']) {
            return None;
        }
        let (labels, value) = rest.rsplit_once(' ')?;
        Some((labels, value.parse::<f64>().ok()?))
    })
}

/// The instance's `/metrics` page.
pub(crate) async fn metrics_text(base: &str) -> anyhow::Result<String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("{base}/metrics"))?
        .text()
        .await
        .with_context(|| format!("{base}/metrics"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_summed_over_its_series_and_no_other() {
        let text = "\
# TYPE seckill_async_claimed_total counter
seckill_async_claimed_total 7
seckill_async_claimed_total{voucher=\"2\"} 3
seckill_async_claimed_total_other 100
# TYPE seckill_async_in_flight gauge
seckill_async_in_flight 0
";
        assert_eq!(sum_of(text, "seckill_async_claimed_total"), 10.0);
        assert_eq!(sum_of(text, "seckill_async_in_flight"), 0.0);
        assert_eq!(sum_of("", "seckill_async_claimed_total"), 0.0);
        let labelled: Vec<(&str, f64)> = series(text, "seckill_async_claimed_total").collect();
        assert_eq!(labelled, [("", 7.0), ("{voucher=\"2\"}", 3.0)]);
    }
}
