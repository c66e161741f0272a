//! The leader's status loop: every template's status brought to the one the world derives
//! ([`crate::world::World::statuses`]), and each warning published once per generation.

use std::collections::BTreeSet;
use std::sync::Arc;

use injector_api::{SidecarTemplate, SidecarTemplateStatus};
use kube::api::Api;
use kube::runtime::events::Recorder;
use kube::runtime::utils::Backoff;
use tokio_util::sync::CancellationToken;

use crate::status::Counts;
use crate::world::{Problem, TemplateStatus, not_served_why};

use super::{Operator, STATUS_PERIOD, next_delay, now, retry_backoff};

/// The events the status loop published, by template name and generation: each is published
/// once for a generation.
#[derive(Default)]
struct StatusEvents {
    /// `Invalid`, `InvalidGenerationKept` or `NotServed`.
    problems: BTreeSet<(String, i64)>,
    /// `PodsStale`.
    stale: BTreeSet<(String, i64)>,
}

impl StatusEvents {
    /// Publishes the events `wanted` calls for that were not published for its template's
    /// generation yet: `PodsStale` when its Pods carry an earlier version, and a warning when
    /// it is invalid or not served; `true` when a publish failed (it is tried again next
    /// round).
    async fn publish(&mut self, recorder: &Recorder, wanted: &TemplateStatus) -> bool {
        let template = &wanted.observed.template;
        let name = &wanted.name;
        let key = (name.clone(), wanted.generation());
        let mut failed = false;
        if let Counts::Counted(tally) = wanted.counts
            && tally.stale > 0
            && !self.stale.contains(&key)
        {
            match crate::status::record_stale(recorder, template, tally).await {
                Ok(()) => {
                    self.stale.insert(key.clone());
                }
                Err(error) => {
                    failed = true;
                    tracing::warn!(template = %name, %error, "recording the template's event failed")
                }
            }
        }
        if let Some(problem) = wanted.problem()
            && !self.problems.contains(&key)
        {
            match record_problem(recorder, template, problem).await {
                Ok(()) => {
                    self.problems.insert(key);
                }
                Err(error) => {
                    failed = true;
                    tracing::warn!(template = %name, %error, "recording the template's event failed")
                }
            }
        }
        failed
    }
}

/// Publishes the warning event of `template`'s `problem`.
async fn record_problem(
    recorder: &Recorder,
    template: &SidecarTemplate,
    problem: Problem<'_>,
) -> Result<(), kube::Error> {
    match problem {
        Problem::NotServed => {
            crate::status::record_not_served(recorder, template, &not_served_why()).await
        }
        Problem::InvalidKept(errors, kept) => {
            crate::status::record_kept(recorder, template, errors, kept).await
        }
        Problem::Invalid(errors) => crate::status::record_invalid(recorder, template, errors).await,
    }
}

impl Operator {
    /// Leader: each template's status, naming the entry that serves it, and an Event when one
    /// is invalid (`Invalid`, or `InvalidGenerationKept` when a required template's last valid
    /// generation stays) or has no entry (`NotServed`).
    /// After a round with a failed write, the next one waits a growing delay.
    pub(super) async fn status_loop(self: Arc<Self>, stop: CancellationToken) {
        let api: Api<SidecarTemplate> = Api::all(self.client.clone());
        let recorder = self.recorder();
        let mut events = StatusEvents::default();
        let mut leading = self.leading.clone();
        let mut retry = retry_backoff();
        loop {
            let failed = self.is_leader() && self.status_round(&api, &recorder, &mut events).await;
            let wait = if failed {
                next_delay(&mut retry).max(STATUS_PERIOD)
            } else {
                retry.reset();
                STATUS_PERIOD
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                changed = Self::leadership_changed(&mut leading, "status") => if !changed { return },
            }
        }
    }

    /// One round of [`Self::status_loop`]: every observed template's status brought to the one
    /// the world wants, and the events it calls for published; `true` when a write failed.
    async fn status_round(
        &self,
        api: &Api<SidecarTemplate>,
        recorder: &Recorder,
        events: &mut StatusEvents,
    ) -> bool {
        let statuses = self.world().statuses(&now());
        // From the same statuses that say `NotServed`, so the metric and they agree (the
        // configuration loop may still be waiting out a retry with an older configuration).
        self.metrics
            .set_templates_not_served(statuses.iter().filter(|s| s.unserved).count());
        let mut failed = false;
        for wanted in &statuses {
            let template = &wanted.observed.template;
            failed |= self
                .write_wanted_status(api, &wanted.name, template, &wanted.desired)
                .await;
            failed |= events.publish(recorder, wanted).await;
        }
        failed
    }

    /// Writes `desired` as the status of the template `name` unless `template` has it already;
    /// `true` when the write failed.
    async fn write_wanted_status(
        &self,
        api: &Api<SidecarTemplate>,
        name: &str,
        template: &SidecarTemplate,
        desired: &SidecarTemplateStatus,
    ) -> bool {
        if !crate::status::needs_update(template.status.as_ref(), desired) {
            return false;
        }
        match crate::status::write_status(api, name, desired).await {
            Ok(()) => {
                self.metrics.record_reconcile("status", true);
                false
            }
            Err(error) => {
                self.metrics.record_reconcile("status", false);
                tracing::warn!(template = %name, %error, "writing template status failed");
                true
            }
        }
    }
}
