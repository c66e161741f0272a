//! The leader's policy loop: the templates a MutatingAdmissionPolicy can express are compiled
//! into one (`injector_core::policy`), proven with a dry run and applied whenever they change;
//! with the `policy` backend, the guard (a ValidatingAdmissionPolicy) keeps required templates'
//! promise, changed around the policy so that no Pod either version injected is refused. On
//! every backend, wherever the API server serves ValidatingAdmissionPolicies, the
//! after-admission policy keeps required templates' containers in running Pods.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use injector_core::CompiledTemplate;
use injector_core::policy::{
    CompiledPolicy, GuardConditions, GuardRule, PolicyOptions, compile_after_admission,
    compile_guard, compile_policy, compile_warnings, guard_rules, keep_guard, presence_conditions,
    unserved_rules,
};
use kube::runtime::utils::Backoff as _;
use kube::runtime::watcher::DefaultBackoff;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Operator, RESYNC, next_delay, retry_backoff};
use crate::policy_backend::{self, Backend, PolicyBackendError, Served};
use crate::status::PolicyState;

/// Why a required template is refused before the policy that injects it is proven.
const NOT_PROVEN: &str =
    "the injection backend is policy, and the policy that injects it is not proven yet";

/// How often the policy loop looks at the templates.
const POLICY_PERIOD: Duration = Duration::from_secs(1);

/// What the policy loop knows during one leadership term.
#[derive(Default)]
struct PolicyTerm {
    /// Which admission policies the API server serves, and when that was asked.
    served: Option<Served>,
    discovered: Option<Instant>,
    /// The snapshot the last round compiled.
    snapshot: Option<Arc<injector_core::Snapshot>>,
    /// The hash of the policy applied in this term.
    applied: Option<String>,
    /// When the last round brought the cluster in line: each [`RESYNC`] a round applies the
    /// policy again (a no-op unless someone changed or deleted it).
    settled_at: Option<Instant>,
    /// The templates the policy in force serves.
    serving: BTreeSet<String>,
    /// The templates left to the webhook, and why.
    webhook_only: BTreeMap<String, (&'static str, String)>,
    /// Why the last round failed.
    failure: Option<String>,
    /// The presence conditions learned from the last proof of the policy in force.
    present: BTreeMap<String, String>,
    /// Per template, what the guard in force puts in force (`policy` backend; `None` until
    /// this term read or wrote it), and its hash.
    guard: Option<GuardConditions>,
    guard_applied: Option<String>,
    retry_at: Option<Instant>,
    /// Whether what this backend does not use (the policy, the guard) was removed.
    removed: bool,
    /// Where the after-admission policy stands.
    after_admission: AfterAdmissionTerm,
}

/// What the policy loop knows of the after-admission policy during one leadership term. Its
/// failures are its own: retried after a growing delay, they hold up nothing else.
#[derive(Default)]
struct AfterAdmissionTerm {
    /// The snapshot it was last put in force for, and when.
    snapshot: Option<Arc<injector_core::Snapshot>>,
    settled_at: Option<Instant>,
    /// The hash of the policy applied in this term (`None`: none, or removed).
    applied: Option<String>,
    /// After a failure, when to try again.
    retry_at: Option<Instant>,
    retry: DefaultBackoff,
}

impl PolicyTerm {
    /// Publishes where the backend stands; the status and configuration loops wake only when
    /// that changed.
    fn publish(&self, state: &watch::Sender<Option<Arc<PolicyState>>>, policy: &str) {
        let next = PolicyState {
            policy: policy.to_owned(),
            available: self.served.is_some_and(|s| s.mutating),
            served: self.serving.clone(),
            webhook_only: self.webhook_only.clone(),
            failure: self.failure.clone(),
            present: self.present.clone(),
            refused: self
                .guard
                .iter()
                .flatten()
                .filter_map(|(name, kept)| Some((name.clone(), kept.refuses.clone()?)))
                .collect(),
        };
        state.send_if_modified(|current| {
            if current.as_deref() == Some(&next) {
                return false;
            }
            *current = Some(Arc::new(next));
            true
        });
    }
}

impl PolicyTerm {
    /// Whether a round has work with `snapshot`: it is not the one compiled last, the last
    /// round failed, or a [`RESYNC`] passed since the cluster was brought in line (then what
    /// this term applied is forgotten, to apply it again).
    fn due(&mut self, snapshot: &Arc<injector_core::Snapshot>) -> bool {
        let unchanged = self
            .snapshot
            .as_ref()
            .is_some_and(|seen| Arc::ptr_eq(seen, snapshot));
        let resync = self.settled_at.is_none_or(|at| at.elapsed() > RESYNC);
        if resync {
            self.applied = None;
            self.guard_applied = None;
        }
        !unchanged || self.failure.is_some() || resync
    }

    /// Notes that the round brought the cluster in line, and publishes where the backend
    /// stands.
    fn settle(&mut self, state: &watch::Sender<Option<Arc<PolicyState>>>, policy: &str) {
        self.failure = None;
        self.settled_at = Some(Instant::now());
        self.publish(state, policy);
    }
}

impl Operator {
    /// Leader: with the `auto` and `policy` backends, the templates a policy can express are
    /// compiled into one MutatingAdmissionPolicy (`injector_core::policy`), proven with a dry
    /// run and applied with its binding whenever they change; with `webhook`, a policy applied
    /// before is removed. The policy's (and the guard's) only writer. A proof or an apply that
    /// fails keeps the policy in force and is tried again after a growing delay.
    pub(super) async fn policy_loop(self: Arc<Self>, stop: CancellationToken) {
        let options = PolicyOptions {
            name: self.options.policy_name.clone(),
            operator_namespace: self.options.namespace.clone(),
            webhook_behind: self.options.backend != Backend::Policy,
        };
        let mut leading = self.leading.clone();
        let mut term = PolicyTerm::default();
        let mut retry = retry_backoff();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(POLICY_PERIOD) => {}
                changed = Self::leadership_changed(&mut leading, "policy") => {
                    if !changed {
                        return;
                    }
                    term = PolicyTerm::default();
                }
            }
            if !self.is_leader() || !self.templates.is_synced() {
                self.policy_state
                    .send_if_modified(|state| state.take().is_some());
                continue;
            }
            if term.retry_at.is_some_and(|at| Instant::now() < at) {
                continue;
            }
            match self.policy_round(&options, &mut term).await {
                Ok(()) => {
                    term.retry_at = None;
                    retry.reset();
                }
                Err(error) => {
                    self.metrics.record_reconcile("policy", false);
                    let delay = next_delay(&mut retry);
                    tracing::warn!(policy = %options.name, %error, retry_in = ?delay, "the policy backend failed; the policy in force stays; retrying");
                    term.retry_at = Some(Instant::now() + delay);
                    // The webhook backend has no policy state to report.
                    if self.options.backend != Backend::Webhook {
                        term.failure = Some(error.to_string());
                        term.publish(&self.policy_state, &options.name);
                    }
                }
            }
        }
    }

    /// One round of [`Operator::policy_loop`].
    async fn policy_round(
        &self,
        options: &PolicyOptions,
        term: &mut PolicyTerm,
    ) -> Result<(), PolicyBackendError> {
        let backend = self.options.backend;
        self.remove_unused(options, term).await?;
        let served = self.served_policies(term).await?;
        if served.validating {
            self.after_admission_round(options, &mut term.after_admission)
                .await;
        }
        if backend == Backend::Webhook {
            self.policy_state
                .send_if_modified(|state| state.take().is_some());
            return Ok(());
        }
        let snapshot = self.templates.snapshot();
        if !term.due(&snapshot) {
            return Ok(());
        }
        term.snapshot = Some(Arc::clone(&snapshot));
        let guarding = backend == Backend::Policy && served.validating;
        if !served.mutating {
            if guarding {
                let rules = guard_rules(snapshot.templates(), None, &BTreeMap::new());
                self.put_guard(options, term, rules).await?;
            }
            term.settle(&self.policy_state, &options.name);
            return Ok(());
        }
        let compiled = compile_policy(snapshot.templates(), options);
        term.webhook_only = compiled
            .webhook_only
            .iter()
            .map(|(t, why)| (t.name.clone(), (why.reason(), why.to_string())))
            .collect();
        let serving: BTreeSet<String> = compiled.served.iter().map(|t| t.name.clone()).collect();
        if !self
            .put_policy(options, term, &snapshot, &compiled, guarding)
            .await?
        {
            return Ok(());
        }
        term.serving = serving;
        term.settle(&self.policy_state, &options.name);
        Ok(())
    }

    /// Once a term, removes what the backend chosen does not use: with `webhook`, the policy,
    /// its warnings and the guard; with `auto`, the guard (behind the webhook it is not
    /// needed: the webhook refuses what it would).
    async fn remove_unused(
        &self,
        options: &PolicyOptions,
        term: &mut PolicyTerm,
    ) -> Result<(), PolicyBackendError> {
        if term.removed {
            return Ok(());
        }
        match self.options.backend {
            Backend::Webhook => {
                policy_backend::put_warnings(&self.client, &options.name, None, None).await?;
                if policy_backend::remove(&self.client, &options.name).await?
                    | policy_backend::remove_guard(&self.client, &options.name).await?
                {
                    tracing::info!(policy = %options.name, "the webhook backend is chosen: the policy and its guard are removed");
                }
            }
            Backend::Auto => {
                if policy_backend::remove_guard(&self.client, &options.name).await? {
                    tracing::info!(policy = %options.name, "the auto backend is chosen: the guard is removed");
                }
            }
            Backend::Policy => return Ok(()),
        }
        term.removed = true;
        Ok(())
    }

    /// Which admission policies the API server serves: asked again at each [`RESYNC`], and
    /// logged when that changed.
    async fn served_policies(&self, term: &mut PolicyTerm) -> Result<Served, PolicyBackendError> {
        if term.served.is_none() || term.discovered.is_none_or(|at| at.elapsed() > RESYNC) {
            let served = policy_backend::served_policies(&self.client).await?;
            if term.served != Some(served) {
                tracing::info!(
                    mutating = served.mutating,
                    validating = served.validating,
                    "which admission policies the API server serves (admissionregistration.k8s.io/v1)"
                );
            }
            term.served = Some(served);
            term.discovered = Some(Instant::now());
        }
        Ok(term.served.unwrap_or_default())
    }

    /// Puts `compiled`, the policy of `snapshot`, in force: removes the policy when no template
    /// can be served by one, proves and applies one that changed ([`Self::change_policy`]),
    /// and with `guarding` puts the guard following it in force. `false` when the templates
    /// changed during the proof: the next round compiles again.
    async fn put_policy(
        &self,
        options: &PolicyOptions,
        term: &mut PolicyTerm,
        snapshot: &Arc<injector_core::Snapshot>,
        compiled: &CompiledPolicy,
        guarding: bool,
    ) -> Result<bool, PolicyBackendError> {
        if compiled.policy.is_none() {
            if term.served.is_some_and(|s| s.validating) {
                policy_backend::put_warnings(&self.client, &options.name, None, None).await?;
            }
            if policy_backend::remove(&self.client, &options.name).await? {
                tracing::info!(policy = %options.name, "no template can be served by a policy: the policy is removed");
            }
            term.applied = None;
            term.present.clear();
            if guarding {
                let rules = guard_rules(snapshot.templates(), Some(compiled), &term.present);
                self.put_guard(options, term, rules).await?;
            }
        } else if term.applied.as_deref() != Some(compiled.hash.as_str()) {
            return self
                .change_policy(options, term, snapshot, compiled, guarding)
                .await;
        } else if guarding && term.guard_applied.is_none() {
            let rules = guard_rules(snapshot.templates(), Some(compiled), &term.present);
            self.put_guard(options, term, rules).await?;
        }
        Ok(true)
    }

    /// Proves `compiled` and puts it in force; with `guarding`, the guard for the change goes in
    /// force first and the guard for the new policy after it. `false` when the templates
    /// changed during the proof: nothing was applied, and the next round compiles again.
    async fn change_policy(
        &self,
        options: &PolicyOptions,
        term: &mut PolicyTerm,
        snapshot: &Arc<injector_core::Snapshot>,
        compiled: &CompiledPolicy,
        guarding: bool,
    ) -> Result<bool, PolicyBackendError> {
        let started = Instant::now();
        let owner = self.options.webhook.owner.as_ref();
        let namespace = &self.options.namespace;
        if guarding {
            // Before the proof: a required template the policy in force does not inject is
            // refused from now on, never admitted without its sidecar while it is proven.
            let in_force = self.guard_in_force(options, term).await?;
            let unproven = unserved_rules(snapshot.templates(), &term.serving, NOT_PROVEN);
            self.keep_guard(options, term, &unproven, in_force, false)
                .await?;
            term.publish(&self.policy_state, &options.name);
        }
        let proven = self
            .prove(options, term, snapshot, compiled, guarding)
            .await?;
        // The proof takes a second or two: a policy compiled from templates that changed
        // meanwhile would put back what the webhook already stopped injecting. The next
        // round compiles the new ones.
        if !Arc::ptr_eq(&self.templates.snapshot(), snapshot) {
            tracing::debug!(policy = %options.name, "the templates changed during the proof; compiling again");
            term.snapshot = None;
            return Ok(false);
        }
        let present = presence_conditions(compiled, &proven);
        let rules = guard_rules(snapshot.templates(), Some(compiled), &present);
        if guarding {
            self.guard_between(options, term, &rules).await?;
        }
        policy_backend::apply_and_confirm(&self.client, compiled, namespace, owner).await?;
        if !Arc::ptr_eq(&self.templates.snapshot(), snapshot) {
            // Changed while it was applied: the next round compiles again.
            term.snapshot = None;
        }
        term.present = present;
        term.applied = Some(compiled.hash.clone());
        if guarding {
            self.put_guard(options, term, rules).await?;
        }
        if term.served.is_some_and(|s| s.validating) {
            let webhook_behind = self.options.backend != Backend::Policy;
            let warnings = compile_warnings(options, compiled, &term.present, webhook_behind);
            policy_backend::put_warnings(&self.client, &options.name, warnings, owner).await?;
        }
        tracing::info!(policy = %options.name, hash = %compiled.hash, recognised = term.present.len(), took = ?started.elapsed(), templates = %compiled.served.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(","), "the policy was proven and applied");
        self.metrics.record_reconcile("policy", true);
        Ok(true)
    }

    /// The guard in force: as this term last knew it, or read (a new leader's, or after an
    /// apply that left it unknown).
    async fn guard_in_force(
        &self,
        options: &PolicyOptions,
        term: &mut PolicyTerm,
    ) -> Result<GuardConditions, PolicyBackendError> {
        match term.guard.take() {
            Some(in_force) => Ok(in_force),
            None => policy_backend::read_guard_in_force(&self.client, &options.name).await,
        }
    }

    /// Proves `compiled` with a dry run; what the API server answered for each template. With
    /// `guarding`, a failed proof leaves the policy in force, and the guard keeps what it
    /// injects and refuses the rest saying why.
    async fn prove(
        &self,
        options: &PolicyOptions,
        term: &mut PolicyTerm,
        snapshot: &Arc<injector_core::Snapshot>,
        compiled: &CompiledPolicy,
        guarding: bool,
    ) -> Result<Vec<serde_json::Value>, PolicyBackendError> {
        let owner = self.options.webhook.owner.as_ref();
        let proof = policy_backend::prove(&self.client, compiled, &self.options.namespace, owner);
        let error = match proof.await {
            Ok(proven) => return Ok(proven),
            Err(error) => error,
        };
        if guarding
            && let PolicyBackendError::Proof(why) = &error
            && let Some(in_force) = term.guard.take()
        {
            let failed = unserved_rules(
                snapshot.templates(),
                &term.serving,
                &format!("the injection backend is policy, and its proof failed: {why}"),
            );
            if let Err(guard_error) = self
                .keep_guard(options, term, &failed, in_force, true)
                .await
            {
                tracing::warn!(policy = %options.name, error = %guard_error, "the guard saying why the proof failed is not in force; the one before it stays");
            }
        }
        Err(error)
    }

    /// Until the API server runs the new policy, a Pod may get either version: puts in force
    /// the guard in between, which accepts both (the guard in force, which a new leader's
    /// predecessor may have left for another version, and the one for `rules`), unless it is.
    async fn guard_between(
        &self,
        options: &PolicyOptions,
        term: &mut PolicyTerm,
        rules: &[(Arc<CompiledTemplate>, GuardRule)],
    ) -> Result<(), PolicyBackendError> {
        let in_force = self.guard_in_force(options, term).await?;
        let target = compile_guard(options, rules, None).map(|g| g.passes);
        if target.as_ref() != Some(&in_force)
            && let Some(between) = compile_guard(options, rules, Some(&in_force))
            && term.guard_applied.as_deref() != Some(between.hash.as_str())
        {
            let result = policy_backend::apply_guard_and_confirm(
                &self.client,
                &between,
                &self.options.namespace,
                self.options.webhook.owner.as_ref(),
            )
            .await;
            // Applied or not, the guard in force may now be the one in between.
            term.guard_applied = None;
            result?;
            term.guard = Some(between.passes);
        } else {
            term.guard = Some(in_force);
        }
        Ok(())
    }

    /// Puts the after-admission policy for the required templates in force (removes it when
    /// none adds a container): when the templates changed, at each [`RESYNC`] (a no-op unless
    /// someone changed or deleted it), and after a failure once its delay passed. Before the
    /// rest of the round, so that a new version's in-place update finds it soon.
    async fn after_admission_round(&self, options: &PolicyOptions, term: &mut AfterAdmissionTerm) {
        if term.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        let snapshot = self.templates.snapshot();
        let unchanged = term
            .snapshot
            .as_ref()
            .is_some_and(|seen| Arc::ptr_eq(seen, &snapshot));
        let resync = term.settled_at.is_none_or(|at| at.elapsed() > RESYNC);
        if unchanged && !resync {
            return;
        }
        let compiled = compile_after_admission(snapshot.templates(), options);
        let owner = self.options.webhook.owner.as_ref();
        match policy_backend::put_after_admission(
            &self.client,
            &options.name,
            compiled.as_ref(),
            owner,
        )
        .await
        {
            Ok(removed) => {
                let hash = compiled.as_ref().map(|c| c.hash.clone());
                match &compiled {
                    Some(compiled) if term.applied != hash => {
                        tracing::info!(policy = %options.name, hash = %compiled.hash, templates = %compiled.templates.join(","), "required templates are kept after admission");
                    }
                    None if removed => {
                        tracing::info!(policy = %options.name, "no required template adds a container: the after-admission policy is removed");
                    }
                    _ => {}
                }
                term.applied = hash;
                term.snapshot = Some(snapshot);
                term.settled_at = Some(Instant::now());
                term.retry_at = None;
                term.retry.reset();
            }
            Err(error) => {
                let delay = next_delay(&mut term.retry);
                tracing::warn!(policy = %options.name, %error, retry_in = ?delay, "putting the after-admission policy in force failed; retrying");
                term.retry_at = Some(Instant::now() + delay);
            }
        }
    }

    /// Puts in force the guard keeping what `in_force` (the guard in force) puts in force and
    /// giving the other templates of `rules` their rule (see [`keep_guard`]), unless it is.
    async fn keep_guard(
        &self,
        options: &PolicyOptions,
        term: &mut PolicyTerm,
        rules: &[(Arc<CompiledTemplate>, GuardRule)],
        in_force: GuardConditions,
        refreshed: bool,
    ) -> Result<(), PolicyBackendError> {
        match keep_guard(options, rules, &in_force, refreshed) {
            Some(guard) if guard.passes != in_force => {
                let owner = self.options.webhook.owner.as_ref();
                term.guard_applied = None;
                policy_backend::apply_guard_and_confirm(
                    &self.client,
                    &guard,
                    &self.options.namespace,
                    owner,
                )
                .await?;
                tracing::info!(policy = %options.name, hash = %guard.hash, refused = %guard.passes.iter().filter(|(_, k)| k.refuses.is_some()).map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(","), "the guard refuses what the templates not served yet select");
                term.guard_applied = Some(guard.hash);
                term.guard = Some(guard.passes);
            }
            // Nothing to change, or no required template: the settled guard follows the policy.
            _ => term.guard = Some(in_force),
        }
        Ok(())
    }

    /// Puts the guard for `rules` in force (removes it when there is no rule), unless it is.
    async fn put_guard(
        &self,
        options: &PolicyOptions,
        term: &mut PolicyTerm,
        rules: Vec<(Arc<CompiledTemplate>, GuardRule)>,
    ) -> Result<(), PolicyBackendError> {
        match compile_guard(options, &rules, None) {
            Some(guard) if term.guard_applied.as_deref() != Some(guard.hash.as_str()) => {
                let owner = self.options.webhook.owner.as_ref();
                // Until confirmed, which guard is in force is not known.
                term.guard = None;
                policy_backend::apply_guard_and_confirm(
                    &self.client,
                    &guard,
                    &self.options.namespace,
                    owner,
                )
                .await?;
                tracing::info!(policy = %options.name, hash = %guard.hash, templates = %rules.iter().map(|(t, _)| t.name.as_str()).collect::<Vec<_>>().join(","), "the guard of required templates is in force");
                term.guard_applied = Some(guard.hash);
                term.guard = Some(guard.passes);
            }
            Some(guard) => term.guard = Some(guard.passes),
            None => {
                term.guard = None;
                if policy_backend::remove_guard(&self.client, &options.name).await? {
                    tracing::info!(policy = %options.name, "no required template: the guard is removed");
                }
                term.guard_applied = None;
                term.guard = Some(BTreeMap::new());
            }
        }
        Ok(())
    }
}
