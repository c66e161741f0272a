//! The leader's loops that work from the Pod census: the census itself, the rollouts it calls
//! for, and the Events telling owners why a best-effort template is missing from their Pods.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::FIELD_MANAGER;
use crate::census::{self, Counted};
use crate::rollout::RolloutDriver;
use crate::skips::{self, SkipKey, SkipLog};

use super::{Operator, STATUS_PERIOD};

impl Operator {
    /// Leader: counts where the Pods stand with each template ([`census`]), for the status
    /// loop and the metric. The Pod and Namespace views are kept only while this replica
    /// leads.
    pub(super) async fn census_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut leading = self.leading.clone();
        loop {
            if self.is_leader() {
                let mut counted: Vec<String> = Vec::new();
                let counting = census::run(
                    self.client.clone(),
                    Arc::clone(&self.templates),
                    self.options.namespace.clone(),
                    |found: Counted| {
                        let gone: Vec<String> = counted
                            .drain(..)
                            .filter(|name| !found.census.contains_key(name))
                            .collect();
                        self.metrics.set_template_pods(
                            found
                                .census
                                .iter()
                                .map(|(name, census)| (name, census.tally)),
                            gone.iter().map(String::as_str),
                        );
                        counted.extend(found.census.keys().cloned());
                        self.census.send_replace(Some(found));
                    },
                );
                let still = tokio::select! {
                    _ = stop.cancelled() => false,
                    () = counting => {
                        tracing::error!("the Pod census's watches ended");
                        false
                    }
                    changed = Self::leadership_changed(&mut leading, "census") => changed,
                };
                self.census.send_replace(None);
                self.metrics.clear_template_pods();
                if !still {
                    return;
                }
            } else {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    changed = Self::leadership_changed(&mut leading, "census") => if !changed { return },
                }
            }
        }
    }

    /// Leader: the rollouts of templates with `updateStrategy: RollingRestart`
    /// ([`crate::rollout`]), a round every [`STATUS_PERIOD`] from the latest census, each
    /// restart announced by an event on its template.
    pub(super) async fn rollout_loop(self: Arc<Self>, stop: CancellationToken) {
        let recorder = self.recorder();
        let mut leading = self.leading.clone();
        let mut driver: Option<RolloutDriver> = None;
        loop {
            if self.is_leader() {
                let counted = self.census.borrow().clone();
                if let Some(counted) = counted {
                    let active =
                        driver.get_or_insert_with(|| RolloutDriver::new(self.client.clone()));
                    let mut restarted = Vec::new();
                    // A round stops where it is when leadership is lost: a deposed leader
                    // restarts and patches nothing more.
                    let round = active.round(&counted, |template, workload| {
                        restarted.push((
                            template.name.clone(),
                            template.generation,
                            workload.clone(),
                        ));
                    });
                    let outcome = tokio::select! {
                        rollouts = round => Some(rollouts),
                        _ = stop.cancelled() => return,
                        changed = Self::leadership_changed(&mut leading, "rollouts") => {
                            if !changed {
                                return;
                            }
                            None
                        }
                    };
                    let Some(rollouts) = outcome else {
                        driver = None;
                        self.rollouts.send_replace(None);
                        continue;
                    };
                    self.rollouts.send_replace(Some(Arc::new(rollouts)));
                    for (name, generation, workload) in restarted {
                        let template = self
                            .observed
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .get(&name)
                            .map(|o| Arc::clone(&o.template));
                        if let Some(template) = template
                            && let Err(error) = crate::status::record_restart(
                                &recorder, &template, generation, &workload,
                            )
                            .await
                        {
                            tracing::warn!(template = %name, %error, "recording the restart's event failed");
                        }
                    }
                }
            } else if driver.take().is_some() {
                self.rollouts.send_replace(None);
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(STATUS_PERIOD) => {}
                changed = Self::leadership_changed(&mut leading, "rollouts") => if !changed { return },
            }
        }
    }

    /// Leader: tells the owners of Pods a best-effort template is missing from why it was
    /// skipped, in an Event ([`crate::skips`]), a round every [`STATUS_PERIOD`] from the
    /// latest census. A new leader starts with nothing learned (and adds to the Events the
    /// last one made, which have the same names).
    pub(super) async fn skip_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut leading = self.leading.clone();
        let mut log = SkipLog::default();
        let started = Instant::now();
        // As the recorder of the other events reports this replica.
        let instance = std::env::var("POD_NAME").unwrap_or_else(|_| FIELD_MANAGER.to_owned());
        // The Pods missing best-effort templates, found again only from a new census.
        let mut found: Option<(Arc<census::Census>, Arc<skips::MissingPods>)> = None;
        loop {
            let counted = self.census.borrow().clone();
            let interrupted = match counted.filter(|_| self.is_leader()) {
                // A round stops where it is when leadership changes: a deposed leader writes
                // no more Events.
                Some(counted) => tokio::select! {
                    () = self.skip_round(&counted, &mut found, &mut log, &started, &instance) => false,
                    _ = stop.cancelled() => return,
                    changed = Self::leadership_changed(&mut leading, "skip events") => {
                        if !changed {
                            return;
                        }
                        true
                    }
                },
                None => false,
            };
            if !interrupted {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(STATUS_PERIOD) => continue,
                    changed = Self::leadership_changed(&mut leading, "skip events") => if !changed { return },
                }
            }
            // Leadership changed: what a round marked as told may not have been written, and a
            // term starts with nothing learned.
            log = SkipLog::default();
            found = None;
        }
    }

    /// One round of [`Self::skip_loop`] from `counted`: the Pods missing best-effort templates
    /// (kept in `found` until the census changes), then [`Self::tell_skips`].
    async fn skip_round(
        &self,
        counted: &Counted,
        found: &mut Option<(Arc<census::Census>, Arc<skips::MissingPods>)>,
        log: &mut SkipLog,
        started: &Instant,
        instance: &str,
    ) {
        let missing = match found {
            Some((census, missing)) if Arc::ptr_eq(census, &counted.census) => Arc::clone(missing),
            _ => match Self::missing_off_runtime(counted).await {
                Some(missing) => missing,
                None => return,
            },
        };
        *found = Some((Arc::clone(&counted.census), Arc::clone(&missing)));
        self.tell_skips(counted, &missing, log, started.elapsed(), instance)
            .await;
    }

    /// [`skips::missing`] of `counted` on a blocking thread (every Pod of the census, against
    /// each best-effort template behind); `None` when that thread failed.
    async fn missing_off_runtime(counted: &Counted) -> Option<Arc<skips::MissingPods>> {
        // Most clusters' rounds: nothing best-effort, so nothing skipped worth telling.
        if !skips::has_best_effort(&counted.snapshot) {
            return Some(Arc::default());
        }
        let snapshot = Arc::clone(&counted.snapshot);
        let census = Arc::clone(&counted.census);
        let pods = Arc::clone(&counted.pods);
        let finding = move || skips::missing(&snapshot, &census, &pods);
        match tokio::task::spawn_blocking(finding).await {
            Ok(missing) => Some(Arc::new(missing)),
            Err(error) => {
                tracing::error!(%error, "finding the Pods missing best-effort templates failed");
                None
            }
        }
    }

    /// One round of [`Self::skip_loop`]: plans again a Pod of each owner of `missing` not
    /// planned yet (at most [`skips::LOOKUPS_PER_ROUND`]), then publishes what is due.
    async fn tell_skips(
        &self,
        counted: &Counted,
        missing: &skips::MissingPods,
        log: &mut SkipLog,
        now: Duration,
        instance: &str,
    ) {
        for key in log.to_plan(missing, skips::LOOKUPS_PER_ROUND) {
            let Some(sample) = missing.get(&key).map(|m| m.sample.clone()) else {
                continue;
            };
            match self.plan_again(counted, &key, &sample).await {
                Ok(Some(reason)) => log.learn(key, reason),
                // Gone meanwhile: another of its Pods next round.
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(pod = %sample, namespace = %key.owner.namespace, %error, "reading a Pod to tell why a template was skipped failed; retrying");
                }
            }
        }
        for tell in log.due(missing, now) {
            if let Err(error) = skips::tell_skip(&self.client, &tell, instance).await {
                tracing::warn!(template = %tell.key.template, owner = %tell.key.owner, %error, "recording why a template was skipped failed; retrying");
                log.untold(&tell.key);
            }
        }
    }

    /// Plans the Pod `name` of `key`'s owner again, as it is stored, with every template in
    /// force and its namespace's labels from the census's view: why `key`'s template is
    /// skipped there (`None`: it is not); `None` when the Pod or its namespace is gone. Read
    /// with a list by name, which the census's RBAC (list Pods) allows, where a get would need
    /// more; at any resourceVersion ("0"), so the API server answers from its watch cache
    /// rather than with a quorum read of etcd for each Pod (the census that chose it is no
    /// newer).
    async fn plan_again(
        &self,
        counted: &Counted,
        key: &SkipKey,
        name: &str,
    ) -> Result<Option<Option<String>>, kube::Error> {
        let namespace = &key.owner.namespace;
        let Some(labels) = counted
            .namespaces
            .get(&ObjectRef::new(namespace))
            .map(|ns| ns.metadata.labels.clone().unwrap_or_default())
        else {
            return Ok(None);
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = ListParams::default()
            .match_any()
            .fields(&format!("metadata.name={name}"));
        let listed = api.list(&params).await?;
        let Some(pod) = listed.items.into_iter().next() else {
            return Ok(None);
        };
        let mut conflicts = skips::conflicts(&pod, &labels, &counted.snapshot);
        Ok(Some(conflicts.remove(&key.template)))
    }
}
