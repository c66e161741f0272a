//! What the benchmark binaries share: a client of the local control plane, Prometheus
//! histograms read from a `/metrics` text (summed over the series a filter keeps, subtracted,
//! their quantiles estimated as Prometheus does), and percentiles of measured durations.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::ControlPlane;

/// A client of `cp` with its admin kubeconfig.
pub async fn client_for(cp: &ControlPlane) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(cp.kubeconfig_path())?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

/// A Prometheus histogram summed over the series a filter keeps.
#[derive(Debug, Default, Clone)]
pub struct Histogram {
    /// Cumulative counts by upper bound (`+Inf` as infinity).
    pub buckets: Vec<(f64, f64)>,
    /// The sum of the observations.
    pub sum: f64,
    /// How many there were.
    pub count: f64,
}

impl Histogram {
    /// The histogram `name` in the Prometheus text `text`, summed over the series `keep`
    /// accepts (by their labels).
    pub fn parse(text: &str, name: &str, keep: impl Fn(&BTreeMap<String, String>) -> bool) -> Self {
        let mut buckets: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        let mut histogram = Histogram::default();
        for (metric, labels, value) in samples(text) {
            if !keep(&labels) {
                continue;
            }
            match metric.strip_prefix(name) {
                Some("_bucket") => {
                    let bound = match labels.get("le").map(String::as_str) {
                        Some("+Inf") => f64::INFINITY,
                        Some(le) => le.parse().unwrap_or(f64::INFINITY),
                        None => continue,
                    };
                    buckets.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += value;
                }
                Some("_sum") => histogram.sum += value,
                Some("_count") => histogram.count += value,
                _ => {}
            }
        }
        histogram.buckets = buckets.into_values().collect();
        histogram.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        histogram
    }

    /// `self - earlier`, bucket by bucket.
    pub fn minus(&self, earlier: &Histogram) -> Histogram {
        let buckets = self
            .buckets
            .iter()
            .map(|(bound, count)| {
                let before = earlier
                    .buckets
                    .iter()
                    .find(|(b, _)| b == bound)
                    .map_or(0.0, |(_, c)| *c);
                (*bound, count - before)
            })
            .collect();
        Histogram {
            buckets,
            sum: self.sum - earlier.sum,
            count: self.count - earlier.count,
        }
    }

    /// The mean observation (0 when there is none).
    pub fn mean(&self) -> f64 {
        if self.count == 0.0 {
            0.0
        } else {
            self.sum / self.count
        }
    }

    /// The share of observations at most `bound` (one of the buckets' upper bounds).
    pub fn share_within(&self, bound: f64) -> f64 {
        let within = self
            .buckets
            .iter()
            .find(|(b, _)| *b == bound)
            .map_or(0.0, |(_, count)| *count);
        if self.count == 0.0 {
            0.0
        } else {
            within / self.count
        }
    }
}

/// Calls of mutating webhooks on CREATEs (all of them Pods in the benchmarks), in the API
/// server's `/metrics` text `metrics`.
pub fn webhook_calls(metrics: &str) -> f64 {
    Histogram::parse(
        metrics,
        "apiserver_admission_webhook_admission_duration_seconds",
        |l| {
            l.get("type").is_some_and(|v| v == "admit")
                && l.get("operation").is_some_and(|v| v == "CREATE")
        },
    )
    .count
}

/// The counter `name` in the Prometheus text `text`, summed over the series `keep` accepts.
pub fn counter(text: &str, name: &str, keep: impl Fn(&BTreeMap<String, String>) -> bool) -> f64 {
    samples(text)
        .filter(|(metric, labels, _)| *metric == name && keep(labels))
        .map(|(_, _, value)| value)
        .sum()
}

/// Each sample of the Prometheus text `text`: its metric, labels and value.
fn samples(text: &str) -> impl Iterator<Item = (&str, BTreeMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value = value.parse::<f64>().ok()?;
            Some(match series.split_once('{') {
                Some((metric, labels)) => {
                    (metric, parse_labels(labels.trim_end_matches('}')), value)
                }
                None => (series, BTreeMap::new(), value),
            })
        })
}

/// `a="x",b="y"` as a map (the values here hold no quotes or commas).
fn parse_labels(labels: &str) -> BTreeMap<String, String> {
    labels
        .split("\",")
        .filter_map(|pair| {
            let (key, value) = pair.split_once("=\"")?;
            Some((
                key.trim().to_owned(),
                value.trim_end_matches('"').to_owned(),
            ))
        })
        .collect()
}

/// The `p`th percentile (nearest rank) of `values`.
pub fn percentile(values: &[Duration], p: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Histogram {
    /// The `q` quantile (0 to 1), as Prometheus's `histogram_quantile` estimates it: linear
    /// within the bucket it falls in; the largest finite bound when it falls in `+Inf`.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.count == 0.0 {
            return 0.0;
        }
        let rank = q * self.count;
        let (mut lower, mut below) = (0.0, 0.0);
        for &(bound, cumulative) in &self.buckets {
            if cumulative >= rank {
                if bound.is_infinite() {
                    return lower;
                }
                let within = cumulative - below;
                return if within <= 0.0 {
                    bound
                } else {
                    lower + (bound - lower) * (rank - below) / within
                };
            }
            (lower, below) = (bound, cumulative);
        }
        lower
    }
}

#[cfg(test)]
mod tests;
