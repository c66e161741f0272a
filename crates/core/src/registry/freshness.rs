//! Whether the templates a replica serves can still be trusted to be the cluster's.
//!
//! A replica whose template watch keeps failing serves a registry that may miss a new required
//! template, and would admit Pods without it (issue 11, rule 6). [`WatchHealth`] remembers when
//! the current run of failures began; once it is older than the grace period the replica
//! reports not ready, so the Service sends its Pods to a replica that is in sync. Only a fresh
//! complete list of the templates ends the run. Pure: the caller passes the time.

use std::time::Duration;

use std::time::Instant;

/// The default grace period: see [`WatchHealth::new`].
pub const DEFAULT_WATCH_GRACE: Duration = Duration::from_secs(60);

/// The state of the template watch, as far as readiness is concerned.
#[derive(Clone, Debug)]
pub struct WatchHealth {
    grace: Duration,
    failing_since: Option<Instant>,
}

impl WatchHealth {
    /// A healthy watch that may fail for `grace` before the replica is not ready.
    ///
    /// The default, 60 s, is twice the watcher's longest backoff between retries (30 s): a
    /// blip (an API server restart, a dropped connection, a relist after `410 Gone`) is over
    /// well within it, so one replica's hiccup does not flap its readiness, while a replica
    /// cut off from the API server stops taking Pods within a minute (plus the readiness
    /// probe's period), which bounds how long a new required template can go unenforced by it.
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            failing_since: None,
        }
    }

    /// The grace period.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// The watch failed at `now`; whether this begins a new run of failures.
    pub fn failed(&mut self, now: Instant) -> bool {
        let new = self.failing_since.is_none();
        self.failing_since.get_or_insert(now);
        new
    }

    /// A complete list of the templates was applied: the registry is the cluster's again.
    pub fn listed(&mut self) {
        self.failing_since = None;
    }

    /// When the current run of failures began, if the watch is failing.
    pub fn failing_since(&self) -> Option<Instant> {
        self.failing_since
    }

    /// `Ok` unless the watch has been failing for longer than the grace period at `now`.
    pub fn check(&self, now: Instant) -> Result<(), &'static str> {
        match self.failing_since {
            Some(since) if now.saturating_duration_since(since) > self.grace => Err(
                "the SidecarTemplate watch has been failing for longer than --template-watch-grace: templates may be out of date",
            ),
            _ => Ok(()),
        }
    }
}

impl Default for WatchHealth {
    fn default() -> Self {
        Self::new(DEFAULT_WATCH_GRACE)
    }
}

#[cfg(test)]
mod tests;
