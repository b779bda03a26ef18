//! The statistics the room is judged by: rank correlation and slope.

/// Spearman's rank correlation of the pairs (ties take their mean rank);
/// NaN with fewer than three.
pub(super) fn spearman(pairs: &[(f64, f64)]) -> f64 {
    if pairs.len() < 3 {
        return f64::NAN;
    }
    let xs: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let ys: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    pearson(&ranks(&xs), &ranks(&ys))
}

/// 1-based ranks, ties sharing their mean rank.
fn ranks(xs: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..xs.len()).collect();
    order.sort_by(|&a, &b| xs[a].total_cmp(&xs[b]));
    let mut ranks = vec![0.0; xs.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && xs[order[j + 1]] == xs[order[i]] {
            j += 1;
        }
        let rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            ranks[k] = rank;
        }
        i = j + 1;
    }
    ranks
}

fn pearson(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (x, y) in xs.iter().zip(ys) {
        sxy += (x - mx) * (y - my);
        sxx += (x - mx) * (x - mx);
        syy += (y - my) * (y - my);
    }
    sxy / (sxx * syy).sqrt()
}

/// The least-squares slope of y over x; NaN without two distinct x.
pub(super) fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return f64::NAN;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    if sxx == 0.0 {
        f64::NAN
    } else {
        sxy / sxx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_is_one_for_any_increasing_pairs_and_minus_one_reversed() {
        let up: Vec<(f64, f64)> = (0..50).map(|i| (f64::from(i), f64::from(i * i))).collect();
        assert!((spearman(&up) - 1.0).abs() < 1e-12);
        let down: Vec<(f64, f64)> = (0..50)
            .map(|i| (f64::from(i), -f64::from(i).exp()))
            .collect();
        assert!((spearman(&down) + 1.0).abs() < 1e-12);
        assert!(spearman(&up[..2]).is_nan());
    }

    #[test]
    fn ties_share_their_mean_rank() {
        assert_eq!(ranks(&[10.0, 20.0, 20.0, 5.0]), vec![2.0, 3.5, 3.5, 1.0]);
        // A textbook example: ρ = 1 - 6 Σd² / (n (n² - 1)) without ties.
        let pairs = [(1.0, 2.0), (2.0, 1.0), (3.0, 4.0), (4.0, 3.0), (5.0, 5.0)];
        let expected = 1.0 - 6.0 * 4.0 / (5.0 * 24.0);
        assert!((spearman(&pairs) - expected).abs() < 1e-12);
    }

    #[test]
    fn the_slope_of_a_counter_at_a_steady_pace_is_its_pace() {
        let points: Vec<(f64, f64)> = (0..100)
            .map(|i| {
                let t = f64::from(i) * 0.05;
                (t, (t * 200.0).floor())
            })
            .collect();
        assert!((slope(&points) - 200.0).abs() < 2.0);
        assert!(slope(&[(1.0, 1.0), (1.0, 2.0)]).is_nan());
    }
}
