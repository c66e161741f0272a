#![allow(clippy::unwrap_used)]

use std::time::Duration;

use super::*;

#[test]
fn histograms_are_summed_and_subtracted() {
    let text = "# HELP x\n\
        x_bucket{a=\"1\",le=\"0.1\"} 10\nx_bucket{a=\"1\",le=\"1\"} 20\nx_bucket{a=\"1\",le=\"+Inf\"} 20\n\
        x_bucket{a=\"2\",le=\"0.1\"} 0\nx_bucket{a=\"2\",le=\"1\"} 20\nx_bucket{a=\"2\",le=\"+Inf\"} 20\n\
        x_sum{a=\"1\"} 4\nx_sum{a=\"2\"} 6\nx_count{a=\"1\"} 20\nx_count{a=\"2\"} 20\n\
        y_bucket{le=\"1\"} 99\n";
    let all = Histogram::parse(text, "x", |_| true);
    assert_eq!(
        all.buckets,
        [(0.1, 10.0), (1.0, 40.0), (f64::INFINITY, 40.0)]
    );
    assert_eq!(all.count, 40.0);
    assert!((all.mean() - 0.25).abs() < 1e-9);
    assert!((all.share_within(0.1) - 0.25).abs() < 1e-9);
    assert!((all.share_within(1.0) - 1.0).abs() < 1e-9);
    let one = Histogram::parse(text, "x", |l| l.get("a").is_some_and(|v| v == "1"));
    let difference = all.minus(&one);
    assert_eq!(
        difference.buckets,
        [(0.1, 0.0), (1.0, 20.0), (f64::INFINITY, 20.0)]
    );
    assert_eq!(Histogram::default().share_within(0.1), 0.0);
}

#[test]
fn percentiles_are_nearest_rank() {
    let values: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
    assert_eq!(percentile(&values, 50.0), Duration::from_millis(50));
    assert_eq!(percentile(&values, 99.0), Duration::from_millis(99));
    assert_eq!(percentile(&values, 0.0), Duration::from_millis(1));
    assert_eq!(percentile(&values, 100.0), Duration::from_millis(100));
}

#[test]
fn quantiles_are_interpolated_within_their_bucket() {
    let histogram = Histogram {
        buckets: vec![(0.1, 50.0), (1.0, 100.0), (f64::INFINITY, 100.0)],
        sum: 30.0,
        count: 100.0,
    };
    assert!((histogram.quantile(0.5) - 0.1).abs() < 1e-9);
    assert!((histogram.quantile(0.75) - 0.55).abs() < 1e-9);
    assert!((histogram.quantile(0.99) - 0.982).abs() < 1e-9);
    let spilled = Histogram {
        buckets: vec![(0.1, 50.0), (f64::INFINITY, 100.0)],
        sum: 30.0,
        count: 100.0,
    };
    assert!((spilled.quantile(0.99) - 0.1).abs() < 1e-9);
    assert_eq!(Histogram::default().quantile(0.5), 0.0);
}
