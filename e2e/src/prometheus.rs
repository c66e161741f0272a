//! [`Prometheus`]: a real Prometheus (`prometheus` of `e2e/control-plane/versions.env`, built by
//! `build.sh`) on 127.0.0.1, scraping static targets every second and evaluating rule files
//! every second, read through its HTTP API (`/api/v1/query`, `/api/v1/rules`,
//! `/api/v1/alerts`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::binaries::tool;
use crate::poll;
use crate::process::{Process, free_ports, http_get, tail};

/// How long Prometheus gets to be ready (it replays nothing: its storage starts empty).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// One scrape job of a single static target.
#[derive(Debug, Clone)]
pub struct ScrapeTarget {
    /// `job_name`, which becomes the `job` label.
    pub job: String,
    /// The target's address.
    pub address: SocketAddr,
    /// Scrape over HTTPS, trusting this CA and sending this bearer token (read from a file).
    pub https: Option<HttpsScrape>,
}

/// How to scrape an HTTPS target that wants a bearer token, such as the API server.
#[derive(Debug, Clone)]
pub struct HttpsScrape {
    /// The CA certificate (PEM) that signed the target's certificate.
    pub ca_file: PathBuf,
    /// A file holding the bearer token.
    pub token_file: PathBuf,
}

/// A running Prometheus, its configuration, storage and log under a directory of the caller's
/// (the control plane's, which is removed with it). Dropping it kills the process.
#[derive(Debug)]
pub struct Prometheus {
    process: Process,
    port: u16,
}

impl Prometheus {
    /// Writes the configuration into `dir` (created), starts Prometheus listening on a free port
    /// of 127.0.0.1, scraping `targets` and evaluating `rule_files`, and waits for `/-/ready`.
    pub fn start(
        dir: &Path,
        targets: &[ScrapeTarget],
        rule_files: &[PathBuf],
    ) -> anyhow::Result<Self> {
        let binary = tool("prometheus")?;
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let config = dir.join("prometheus.yml");
        // JSON is YAML: the configuration is written with serde_json.
        std::fs::write(
            &config,
            serde_json::to_vec_pretty(&config_json(targets, rule_files))?,
        )
        .with_context(|| format!("cannot write {}", config.display()))?;
        let [port] = free_ports::<1>()?;
        let args = [
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
        ];
        let process = Process::spawn(
            "prometheus",
            &binary,
            &args,
            dir,
            dir.join("prometheus.log"),
            &[],
        )?;
        let mut prometheus = Self { process, port };
        let ready = poll(READY_TIMEOUT, "Prometheus's /-/ready", || {
            prometheus.process.check_running()?;
            let (status, _) = http_get(port, "/-/ready", Duration::from_secs(2))?;
            Ok((status == 200).then_some(()))
        });
        if let Err(e) = ready {
            return Err(e.context(prometheus.log_tail(30)));
        }
        eprintln!(
            "[e2e] prometheus ready on 127.0.0.1:{port} (pid {})",
            prometheus.process.pid().unwrap_or_default()
        );
        Ok(prometheus)
    }

    /// `GET /api/v1/query?query=EXPR` (an instant query, now): the `result` array. An error
    /// when Prometheus answers anything but `status: success` (a query that does not parse or
    /// cannot be evaluated), with its `error`.
    pub fn query(&self, expr: &str) -> anyhow::Result<Vec<Value>> {
        self.api_array(
            &format!("/api/v1/query?query={}", percent_encode(expr)),
            "result",
        )
    }

    /// `GET /api/v1/rules`: every rule of every group, as Prometheus loaded it (`name`, `query`,
    /// `health`, `lastError`, `lastEvaluation`, `state`, …).
    pub fn rules(&self) -> anyhow::Result<Vec<Value>> {
        let data = self.api("/api/v1/rules")?;
        Ok(data["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|group| group["rules"].as_array().cloned().unwrap_or_default())
            .collect())
    }

    /// `GET /api/v1/alerts`: the alerts pending or firing now.
    pub fn alerts(&self) -> anyhow::Result<Vec<Value>> {
        self.api_array("/api/v1/alerts", "alerts")
    }

    /// `GET /api/v1/targets`: the active targets (`scrapePool`, `health`, `lastError`, …).
    pub fn targets(&self) -> anyhow::Result<Vec<Value>> {
        self.api_array("/api/v1/targets", "activeTargets")
    }

    /// The array `key` of an API call's `data`.
    fn api_array(&self, path: &str, key: &str) -> anyhow::Result<Vec<Value>> {
        let data = self.api(path)?;
        data[key]
            .as_array()
            .cloned()
            .with_context(|| format!("{path}: no array {key} in {data}"))
    }

    /// An API call: its `data`, or an error with Prometheus's `errorType` and `error`.
    fn api(&self, path: &str) -> anyhow::Result<Value> {
        let (status, body) = http_get(self.port, path, Duration::from_secs(10))?;
        let answer: Value = serde_json::from_str(&body)
            .with_context(|| format!("{path} answered {status}, not JSON: {body}"))?;
        if answer["status"] != "success" {
            bail!(
                "{path} answered {status}: {} {}",
                answer["errorType"],
                answer["error"]
            );
        }
        Ok(answer["data"].clone())
    }

    /// The last `lines` lines of Prometheus's log.
    pub fn log_tail(&self, lines: usize) -> String {
        format!(
            "----- prometheus ({}) -----\n{}",
            self.process.log().display(),
            tail(self.process.log(), lines)
        )
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail(30));
        }
        self.process.kill();
    }
}

/// The configuration: every second a scrape and a rule evaluation, one job per target.
fn config_json(targets: &[ScrapeTarget], rule_files: &[PathBuf]) -> Value {
    let jobs: Vec<Value> = targets
        .iter()
        .map(|target| {
            let mut job = json!({
                "job_name": target.job,
                "static_configs": [{"targets": [target.address.to_string()]}],
            });
            if let Some(https) = &target.https {
                job["scheme"] = json!("https");
                job["tls_config"] = json!({"ca_file": https.ca_file});
                job["authorization"] = json!({"credentials_file": https.token_file});
            }
            job
        })
        .collect();
    json!({
        "global": {
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "evaluation_interval": "1s",
        },
        "rule_files": rule_files,
        "scrape_configs": jobs,
    })
}

/// `text` for a URL's query string: every byte but RFC 3986's unreserved ones as `%XX`.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            percent_encode(r#"sum(rate(x{a=~".*\\.b"}[5m])) > 0"#),
            "sum%28rate%28x%7Ba%3D~%22.%2A%5C%5C.b%22%7D%5B5m%5D%29%29%20%3E%200"
        );
    }

    #[test]
    fn the_configuration_scrapes_https_targets_with_a_token() {
        let config = config_json(
            &[
                ScrapeTarget {
                    job: "op".to_owned(),
                    address: "127.0.0.1:8080".parse().unwrap(),
                    https: None,
                },
                ScrapeTarget {
                    job: "api".to_owned(),
                    address: "127.0.0.1:6443".parse().unwrap(),
                    https: Some(HttpsScrape {
                        ca_file: "/d/ca.crt".into(),
                        token_file: "/d/token".into(),
                    }),
                },
            ],
            &["/d/rules.yaml".into()],
        );
        assert_eq!(config["rule_files"], json!(["/d/rules.yaml"]));
        let jobs = config["scrape_configs"].as_array().unwrap();
        assert_eq!(jobs[0]["static_configs"][0]["targets"][0], "127.0.0.1:8080");
        assert!(jobs[0].get("scheme").is_none());
        assert_eq!(jobs[1]["scheme"], "https");
        assert_eq!(jobs[1]["tls_config"]["ca_file"], "/d/ca.crt");
        assert_eq!(jobs[1]["authorization"]["credentials_file"], "/d/token");
    }
}
