//! Leader election on a `coordination.k8s.io/v1` Lease in the operator's namespace
//! (docs/architecture.md, decisions 6 and 14: replicas all serve; only the leader writes).
//!
//! [`decide`] is the pure decision: given the Lease as read (or its absence), who we are and how
//! long this replica has seen the Lease unchanged, whether to create it, renew it, take it over
//! or wait; [`next_lease`] and [`released`] say what to write. [`campaign`] is the thin loop
//! around them: every [`renew_interval`](LeaderElectionConfig::renew_interval) it reads the
//! Lease, decides, and writes it with the `resourceVersion` it read, so that when two replicas
//! race only one write succeeds and the other gets `409 Conflict`. It publishes whether this
//! replica leads on a `watch` channel, which the writers (status, webhook configuration,
//! certificates) follow.
//!
//! No clock is compared across replicas. As client-go does, a Lease held by another replica
//! is judged by when *this* replica saw it change ([`LeaseObserver`]: its `resourceVersion`,
//! holder or `renewTime`), on its own monotonic clock: it is taken over only once it has
//! stayed unchanged for its `leaseDurationSeconds`. The `renewTime` written by the holder's
//! clock is never compared with ours, so a holder whose clock is hours behind or ahead is
//! neither robbed while it renews nor waited for after it stops.
//!
//! Safety margin: a leader that cannot renew for
//! [`renew_deadline`](LeaderElectionConfig::renew_deadline) (measured on its own monotonic
//! clock from the start of its last successful renewal) stops leading, while another replica
//! takes over only [`lease_duration`](LeaderElectionConfig::lease_duration) after it saw that
//! renewal, which is later. The difference between the two (5 s by default) covers clocks
//! that run at slightly different rates, and the time a write takes.

use std::fmt;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Default [`LeaderElectionConfig::lease_duration`]: 15 s, as in client-go.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);

/// Default [`LeaderElectionConfig::renew_interval`]: 2 s, as client-go's retry period.
pub const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(2);

/// Default [`LeaderElectionConfig::renew_deadline`]: 10 s, as in client-go.
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// The `leaseDurationSeconds` written when releasing the Lease, for candidates that only look at
/// expiry and not at the (absent) holder.
const RELEASED_LEASE_DURATION_SECONDS: i32 = 1;

/// How to elect the leader.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaderElectionConfig {
    /// The Lease's name.
    pub lease_name: String,
    /// The Lease's namespace: the operator's own.
    pub namespace: String,
    /// This replica's identity, unique among the replicas and across restarts (e.g. the pod
    /// name, or the hostname and a random suffix): a restarted replica that reused its
    /// predecessor's identity would believe it already holds the Lease.
    pub identity: String,
    /// How long a Lease stays held after its last renewal: other replicas take it over once
    /// this has passed. Written as whole seconds, rounded up.
    pub lease_duration: Duration,
    /// How often the Lease is read and renewed (or acquisition retried).
    pub renew_interval: Duration,
    /// How long the leader keeps leading while its renewals fail; shorter than
    /// [`Self::lease_duration`], so it stops before another replica can take over.
    pub renew_deadline: Duration,
    /// The Lease's owner, so that deleting the owner deletes the Lease (see [`crate::ownership`]).
    pub owner: Option<OwnerReference>,
}

impl LeaderElectionConfig {
    /// A configuration with the default durations.
    pub fn new(
        lease_name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        Self {
            lease_name: lease_name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_interval: DEFAULT_RENEW_INTERVAL,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            owner: None,
        }
    }

    /// Checks that the names are set and that
    /// `0 < renew_interval < renew_deadline < lease_duration`: without that ordering two
    /// replicas could lead at once. [`campaign`] calls it first.
    pub fn validate(&self) -> Result<(), LeaderError> {
        let invalid = |reason: String| Err(LeaderError::InvalidConfig(reason));
        if self.lease_name.is_empty() {
            return invalid("the lease name is empty".into());
        }
        if self.namespace.is_empty() {
            return invalid("the namespace is empty".into());
        }
        if self.identity.is_empty() {
            return invalid("the identity is empty".into());
        }
        if self.renew_interval.is_zero() {
            return invalid("the renew interval is zero".into());
        }
        if self.renew_interval >= self.renew_deadline {
            return invalid(format!(
                "the renew interval ({:?}) must be shorter than the renew deadline ({:?})",
                self.renew_interval, self.renew_deadline
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return invalid(format!(
                "the renew deadline ({:?}) must be shorter than the lease duration ({:?})",
                self.renew_deadline, self.lease_duration
            ));
        }
        Ok(())
    }
}

/// Why leader election cannot run or could not end cleanly.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The configuration is unusable (see [`LeaderElectionConfig::validate`]).
    #[error("invalid leader election configuration: {0}")]
    InvalidConfig(String),
    /// Releasing the Lease on stop failed; it expires on its own after its
    /// `leaseDurationSeconds`, so another replica takes over late rather than never.
    #[error("cannot release the lease {lease}: {source}")]
    Release {
        /// The Lease's name.
        lease: String,
        /// What the API server (or the connection to it) answered.
        #[source]
        source: kube::Error,
    },
    /// Releasing the Lease on stop took longer than the renew deadline; as for
    /// [`Self::Release`], the Lease expires on its own.
    #[error("releasing the lease {lease} timed out after {after:?}")]
    ReleaseTimedOut {
        /// The Lease's name.
        lease: String,
        /// How long the release was given.
        after: Duration,
    },
}

/// What to do with the Lease, as decided by [`decide`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease: create it, held by us.
    Create,
    /// We hold the Lease: renew it.
    Renew,
    /// Nobody holds the Lease, or its holder let it expire: take it over.
    TakeOver {
        /// The holder that let it expire; `None` when it was released or never held.
        previous: Option<String>,
    },
    /// Another replica holds the Lease: leave it alone.
    Wait {
        /// The holder.
        holder: String,
        /// How much longer the Lease stays held unless this replica sees it change.
        remaining: Duration,
    },
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Create => f.write_str("created the lease"),
            Decision::Renew => f.write_str("renewed the lease"),
            Decision::TakeOver { previous: None } => f.write_str("took over the released lease"),
            Decision::TakeOver {
                previous: Some(previous),
            } => write!(f, "took over the lease {previous} let expire"),
            Decision::Wait { holder, remaining } => {
                write!(
                    f,
                    "the lease is held by {holder} for another {remaining:?} unless renewed"
                )
            }
        }
    }
}

/// What identifies one write of a Lease, for [`LeaseObserver`]: any write changes the
/// `resourceVersion`; the holder and `renewTime` are compared too.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LeaseVersion {
    resource_version: Option<String>,
    holder: Option<String>,
    renew_time: Option<MicroTime>,
}

impl LeaseVersion {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        LeaseVersion {
            resource_version: lease.metadata.resource_version.clone(),
            holder: spec.and_then(|spec| spec.holder_identity.clone()),
            renew_time: spec.and_then(|spec| spec.renew_time.clone()),
        }
    }
}

/// When this replica last saw the Lease change, on its own monotonic clock: what [`decide`]
/// judges another holder's Lease by, instead of the `renewTime` the holder's clock wrote.
#[derive(Debug, Default)]
pub struct LeaseObserver {
    last: Option<(LeaseVersion, Instant)>,
}

impl LeaseObserver {
    /// Records `lease` as read at `now`; returns how long it has looked the same to this
    /// replica (zero when it changed, or was never seen before).
    pub fn observe(&mut self, lease: &Lease, now: Instant) -> Duration {
        let version = LeaseVersion::of(lease);
        match &self.last {
            Some((seen, since)) if *seen == version => now.saturating_duration_since(*since),
            _ => {
                self.last = Some((version, now));
                Duration::ZERO
            }
        }
    }
}

/// Decides what to do with `lease` (`None` when it does not exist) as `identity`, when this
/// replica has seen it unchanged for `unchanged_for` (see [`LeaseObserver`]).
///
/// Another holder's Lease expires once it has stayed unchanged for its `leaseDurationSeconds`
/// (`lease_duration` when it states no positive duration); its times are not read, since they
/// come from another clock. A Lease we hold is renewed even when it has expired: nobody has
/// taken it over, and the write carries the `resourceVersion` read, so it fails if someone does
/// in the meantime.
pub fn decide(
    lease: Option<&Lease>,
    identity: &str,
    unchanged_for: Duration,
    lease_duration: Duration,
) -> Decision {
    let Some(lease) = lease else {
        return Decision::Create;
    };
    let Some(spec) = lease.spec.as_ref() else {
        return Decision::TakeOver { previous: None };
    };
    let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty());
    let Some(holder) = holder else {
        return Decision::TakeOver { previous: None };
    };
    if holder == identity {
        return Decision::Renew;
    }
    let duration = spec
        .lease_duration_seconds
        .and_then(|seconds| u64::try_from(seconds).ok())
        .filter(|&seconds| seconds > 0)
        .map_or(lease_duration, Duration::from_secs);
    match duration.checked_sub(unchanged_for) {
        Some(remaining) if !remaining.is_zero() => Decision::Wait {
            holder: holder.to_owned(),
            remaining,
        },
        _ => Decision::TakeOver {
            previous: Some(holder.to_owned()),
        },
    }
}

/// `duration` as `leaseDurationSeconds`: whole seconds rounded up, so other replicas never wait
/// less than configured, and at least 1, the least the API server accepts.
pub fn lease_duration_seconds(duration: Duration) -> i32 {
    let seconds = duration
        .as_secs()
        .saturating_add(u64::from(duration.subsec_nanos() > 0));
    i32::try_from(seconds).unwrap_or(i32::MAX).max(1)
}

/// The Lease to write to carry out `decision` (`None` for [`Decision::Wait`]), made from the
/// Lease read (`current`) so that it keeps its `resourceVersion` and the fields this module does
/// not own.
///
/// Every write sets us as the holder, `renewTime` to `now` and `leaseDurationSeconds` from
/// `config`. Creating or taking over also sets `acquireTime` to `now`; taking over adds one to
/// `leaseTransitions`; renewing keeps both.
pub fn next_lease(
    current: Option<&Lease>,
    decision: &Decision,
    config: &LeaderElectionConfig,
    now: &MicroTime,
) -> Option<Lease> {
    let mut lease = current.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(config.lease_name.clone()),
            namespace: Some(config.namespace.clone()),
            ..ObjectMeta::default()
        },
        spec: None,
    });
    if let Some(owner) = &config.owner {
        crate::ownership::add_owner(&mut lease.metadata, owner);
    }
    let previous = lease.spec.take().unwrap_or_default();
    let held = LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        renew_time: Some(now.clone()),
        lease_duration_seconds: Some(lease_duration_seconds(config.lease_duration)),
        ..previous.clone()
    };
    let spec = match decision {
        Decision::Wait { .. } => return None,
        Decision::Create => LeaseSpec {
            acquire_time: Some(now.clone()),
            lease_transitions: Some(0),
            ..held
        },
        Decision::Renew => LeaseSpec {
            acquire_time: previous.acquire_time.or_else(|| Some(now.clone())),
            ..held
        },
        Decision::TakeOver { .. } => LeaseSpec {
            acquire_time: Some(now.clone()),
            lease_transitions: Some(previous.lease_transitions.unwrap_or(0).saturating_add(1)),
            ..held
        },
    };
    lease.spec = Some(spec);
    Some(lease)
}

/// `current` released at `now`: no holder, renewed now, with a one-second duration, so that
/// another replica takes it over on its next attempt instead of waiting for it to expire.
pub fn released(current: &Lease, now: &MicroTime) -> Lease {
    let mut lease = current.clone();
    let spec = lease.spec.take().unwrap_or_default();
    lease.spec = Some(LeaseSpec {
        holder_identity: None,
        renew_time: Some(now.clone()),
        lease_duration_seconds: Some(RELEASED_LEASE_DURATION_SECONDS),
        ..spec
    });
    lease
}

/// Runs leader election until `stop` is cancelled, publishing on `leading` whether this
/// replica is the leader.
///
/// Errors from the API server are logged and retried, never returned: a replica that cannot
/// reach the API server stops leading after the renew deadline and keeps trying. On `stop` a
/// leader first publishes `false`, then releases the Lease so that another replica takes over
/// at once. Only two things are returned as errors: an invalid configuration (before any
/// request, `leading` untouched) and a failed release (after `leading` is already `false`).
pub async fn campaign(
    client: kube::Client,
    config: LeaderElectionConfig,
    leading: watch::Sender<bool>,
    stop: CancellationToken,
) -> Result<(), LeaderError> {
    config.validate()?;
    let mut elector = Elector {
        api: Api::namespaced(client, &config.namespace),
        config,
        leading,
        is_leading: false,
        renewed_at: None,
        observer: LeaseObserver::default(),
    };
    // Leading was not established by this call, whatever the channel held before.
    elector.set_leading(false);
    loop {
        elector.check_deadline();
        let started = Instant::now();
        let attempt = tokio::time::timeout_at(elector.attempt_deadline(started), elector.attempt());
        let outcome = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            outcome = attempt => outcome,
        };
        elector.record(started, outcome);
        let wake = elector.next_attempt(Instant::now());
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            () = tokio::time::sleep_until(wake) => {}
        }
    }
    elector.shutdown().await
}

/// The parameters of every write to the Lease, naming the operator as the field manager.
fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(crate::FIELD_MANAGER.into()),
        ..PostParams::default()
    }
}

/// What one attempt found.
enum Round {
    /// We wrote the Lease: we lead.
    Leader(Decision),
    /// Another replica holds the Lease ([`Decision::Wait`]).
    Follower(Decision),
    /// Our write lost a race (`409 Conflict`): someone wrote the Lease since we read it.
    Conflict,
}

/// The state of [`campaign`].
struct Elector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    leading: watch::Sender<bool>,
    /// What was last published on `leading`.
    is_leading: bool,
    /// When the last successful acquisition or renewal started, while leading.
    renewed_at: Option<Instant>,
    /// When this replica saw the Lease change.
    observer: LeaseObserver,
}

impl Elector {
    /// Reads the Lease, decides, and writes it if we should hold it.
    async fn attempt(&mut self) -> Result<Round, kube::Error> {
        let current = self.get().await?;
        let unchanged_for = current.as_ref().map_or(Duration::ZERO, |lease| {
            self.observer.observe(lease, Instant::now())
        });
        let decision = decide(
            current.as_ref(),
            &self.config.identity,
            unchanged_for,
            self.config.lease_duration,
        );
        let now = MicroTime(Timestamp::now());
        let Some(lease) = next_lease(current.as_ref(), &decision, &self.config, &now) else {
            return Ok(Round::Follower(decision));
        };
        let params = post_params();
        let written = match current {
            None => self.api.create(&params, &lease).await,
            Some(_) => {
                self.api
                    .replace(&self.config.lease_name, &params, &lease)
                    .await
            }
        };
        match written {
            Ok(_) => Ok(Round::Leader(decision)),
            // A create that loses its race answers 409 AlreadyExists, a replace 409 Conflict.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Round::Conflict),
            Err(error) => Err(error),
        }
    }

    /// The Lease, or `None` if it does not exist.
    async fn get(&self) -> Result<Option<Lease>, kube::Error> {
        // By code rather than `Api::get_opt`, which recognises a 404 only by its reason.
        match self.api.get(&self.config.lease_name).await {
            Ok(lease) => Ok(Some(lease)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Until when an attempt starting at `started` may run: a leader's attempt must not outlast
    /// its deadline, or it would keep leading on a Lease others may already have taken.
    fn attempt_deadline(&self, started: Instant) -> Instant {
        match self.leader_deadline() {
            Some(deadline) => deadline,
            None => started + self.config.renew_deadline,
        }
    }

    /// When the next attempt starts, if the last one ended at `now`: a leader also wakes at its
    /// deadline, to stop leading exactly then.
    fn next_attempt(&self, now: Instant) -> Instant {
        let next = now + self.config.renew_interval;
        match self.leader_deadline() {
            Some(deadline) => next.min(deadline),
            None => next,
        }
    }

    /// When the leader stops leading unless it renews first.
    fn leader_deadline(&self) -> Option<Instant> {
        self.renewed_at
            .filter(|_| self.is_leading)
            .map(|renewed_at| renewed_at + self.config.renew_deadline)
    }

    /// Stops leading if the last successful renewal is older than the renew deadline.
    fn check_deadline(&mut self) {
        if let Some(deadline) = self.leader_deadline()
            && Instant::now() >= deadline
        {
            tracing::info!(
                lease = %self.config.lease_name,
                identity = %self.config.identity,
                renew_deadline = ?self.config.renew_deadline,
                "lost leadership: the lease could not be renewed within the renew deadline"
            );
            self.set_leading(false);
        }
    }

    /// Acts on the outcome of the attempt that started at `started`.
    fn record(
        &mut self,
        started: Instant,
        outcome: Result<Result<Round, kube::Error>, tokio::time::error::Elapsed>,
    ) {
        let lease = &self.config.lease_name;
        let identity = &self.config.identity;
        match outcome {
            Ok(Ok(Round::Leader(decision))) => {
                // From the start: the renewTime written was taken then, and others count from it.
                self.renewed_at = Some(started);
                if !self.is_leading {
                    tracing::info!(%lease, %identity, how = %decision, "became the leader");
                    self.set_leading(true);
                }
            }
            Ok(Ok(Round::Follower(decision))) => {
                if self.is_leading {
                    tracing::info!(%lease, %identity, why = %decision, "lost leadership");
                    self.set_leading(false);
                } else {
                    tracing::debug!(%lease, %identity, %decision, "not the leader");
                }
            }
            Ok(Ok(Round::Conflict)) => {
                if self.is_leading {
                    tracing::info!(
                        %lease,
                        %identity,
                        "lost leadership: the lease was written by someone else since it was read"
                    );
                    self.set_leading(false);
                } else {
                    tracing::debug!(%lease, %identity, "lost the race for the lease");
                }
            }
            Ok(Err(error)) => {
                tracing::warn!(%lease, %identity, leading = self.is_leading, %error,
                    "cannot read or write the lease");
                self.check_deadline();
            }
            Err(_elapsed) => {
                tracing::warn!(%lease, %identity, leading = self.is_leading,
                    "reading or writing the lease timed out");
                self.check_deadline();
            }
        }
    }

    /// Publishes whether we lead, waking receivers only on a change.
    fn set_leading(&mut self, leading: bool) {
        self.is_leading = leading;
        if !leading {
            self.renewed_at = None;
        }
        self.leading.send_if_modified(|current| {
            let changed = *current != leading;
            *current = leading;
            changed
        });
    }

    /// On stop: stops leading, then releases the Lease if we held it.
    async fn shutdown(mut self) -> Result<(), LeaderError> {
        let was_leading = self.is_leading;
        // Before releasing: once released another replica may lead, and two must not write.
        self.set_leading(false);
        if !was_leading {
            return Ok(());
        }
        tracing::info!(
            lease = %self.config.lease_name,
            identity = %self.config.identity,
            "stopping: gave up leadership, releasing the lease"
        );
        let after = self.config.renew_deadline;
        match tokio::time::timeout(after, self.release()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(LeaderError::Release {
                lease: self.config.lease_name.clone(),
                source,
            }),
            Err(_elapsed) => Err(LeaderError::ReleaseTimedOut {
                lease: self.config.lease_name.clone(),
                after,
            }),
        }
    }

    /// Releases the Lease if we still hold it. It is read again rather than remembered: an
    /// attempt interrupted by the stop may have renewed it since the last one we saw.
    async fn release(&self) -> Result<(), kube::Error> {
        let Some(current) = self.get().await? else {
            return Ok(());
        };
        let holder = current
            .spec
            .as_ref()
            .and_then(|spec| spec.holder_identity.as_deref());
        if holder != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let now = MicroTime(Timestamp::now());
        let lease = released(&current, &now);
        match self
            .api
            .replace(&self.config.lease_name, &post_params(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            // Someone wrote it since: it is no longer ours to release.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(error) => Err(error),
        }
    }
}

#[cfg(test)]
mod tests;
