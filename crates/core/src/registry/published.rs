//! The cell between the controller, which publishes each new snapshot of the registry, and
//! the webhook, which reads the current one on every request without a lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::registry::Snapshot;
use crate::registry::freshness::{DEFAULT_WATCH_GRACE, WatchHealth};

/// What the webhook serves from and the controller publishes to: the template snapshot,
/// whether it is complete, and whether the watch feeding it is healthy.
#[derive(Debug)]
pub struct Templates {
    snapshot: ArcSwap<Snapshot>,
    synced: AtomicBool,
    watch: Mutex<WatchHealth>,
}

impl Templates {
    /// No templates yet, not synced; the default grace period for watch failures.
    pub fn new() -> Arc<Self> {
        Self::with_watch_grace(DEFAULT_WATCH_GRACE)
    }

    /// No templates yet, not synced; a template watch failing for longer than `grace` makes
    /// the replica not ready.
    pub fn with_watch_grace(grace: Duration) -> Arc<Self> {
        Arc::new(Self {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            synced: AtomicBool::new(false),
            watch: Mutex::new(WatchHealth::new(grace)),
        })
    }

    /// Publishes a new snapshot; requests that started earlier finish with the old one.
    pub fn publish(&self, snapshot: Arc<Snapshot>) {
        self.snapshot.store(snapshot);
    }

    /// Marks the snapshot complete (a full list was applied); this also ends a run of watch
    /// failures.
    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
        self.watch_health().listed();
    }

    /// Whether the first full list was applied.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// The template watch failed at `now`; whether this begins a new run of failures.
    pub fn watch_failed(&self, now: Instant) -> bool {
        self.watch_health().failed(now)
    }

    /// How long the template watch may fail before the replica is not ready.
    pub fn watch_grace(&self) -> Duration {
        self.watch_health().grace()
    }

    /// `Ok` unless the template watch has been failing for longer than the grace period.
    pub fn freshness(&self, now: Instant) -> Result<(), &'static str> {
        self.watch_health().check(now)
    }

    fn watch_health(&self) -> std::sync::MutexGuard<'_, WatchHealth> {
        self.watch.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// The current snapshot, held for one request: unlike [`Templates::snapshot`] it touches
    /// no reference count, a cache line every core serving requests would otherwise take in
    /// turn. Hold it briefly (a thread has a few such loans before one costs an `Arc`).
    pub fn current(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.snapshot.load()
    }
}

#[cfg(test)]
mod tests;
