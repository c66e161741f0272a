//! `kubectl sidecar explain`, without I/O: which object a `KIND/NAME` names, and the decision
//! replayed for it against the templates in force and its namespace's labels: what a Pod
//! carries (its record, and where it stands with each template), then what planning it now
//! gives and why each template applies or not, through the same code as `render --explain`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use injector_api::names::INJECTED_ANNOTATION;
use injector_core::after_admission::lifecycle::{PodMeta, PodState, Recorded, recorded, standing};
use injector_core::{CompiledTemplate, NamespaceInfo};
use serde_json::Value;

use crate::render::{container_summary, explain as explain_plan, plan_object, text_at};

/// The kinds `explain` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    /// A Pod: planned as it is.
    Pod,
    /// A Deployment's pod template.
    Deployment,
    /// A StatefulSet's pod template.
    StatefulSet,
    /// A DaemonSet's pod template.
    DaemonSet,
    /// A ReplicaSet's pod template.
    ReplicaSet,
    /// A Job's pod template.
    Job,
    /// A CronJob's Job's pod template.
    CronJob,
}

impl TargetKind {
    /// Every kind `explain` takes.
    pub const ALL: [TargetKind; 7] = [
        TargetKind::Pod,
        TargetKind::Deployment,
        TargetKind::StatefulSet,
        TargetKind::DaemonSet,
        TargetKind::ReplicaSet,
        TargetKind::Job,
        TargetKind::CronJob,
    ];

    /// The kind, as in `kind:`.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Pod => "Pod",
            TargetKind::Deployment => "Deployment",
            TargetKind::StatefulSet => "StatefulSet",
            TargetKind::DaemonSet => "DaemonSet",
            TargetKind::ReplicaSet => "ReplicaSet",
            TargetKind::Job => "Job",
            TargetKind::CronJob => "CronJob",
        }
    }

    /// The kind a controller owner reference names, when `explain` takes it.
    pub fn of_owner(kind: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|k| *k != TargetKind::Pod && k.as_str() == kind)
    }
}

/// An object named on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its kind.
    pub kind: TargetKind,
    /// Its name.
    pub name: String,
}

/// `KIND/NAME` that `explain` cannot take.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// No `/`, or nothing on a side of it.
    #[error("{0:?}: expected KIND/NAME, such as pod/web-0 or deployment/web")]
    Shape(String),
    /// A kind without pods.
    #[error(
        "{0:?}: not a kind explain takes (pod, deployment, statefulset, daemonset, replicaset, job, cronjob)"
    )]
    Kind(String),
    /// A kind `check` does not take: it checks a Pod.
    #[error(
        "{0:?}: check takes a Pod (NAME or pod/NAME); `kubectl sidecar explain {0}` replays the decision for a workload"
    )]
    NotPod(String),
}

impl std::str::FromStr for Target {
    type Err = TargetError;

    /// Reads `KIND/NAME` as kubectl does: plural, singular or short kind, optionally with its
    /// group (`deployment.apps/web`), in any case.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (kind, name) = text
            .split_once('/')
            .filter(|(kind, name)| !kind.is_empty() && !name.is_empty() && !name.contains('/'))
            .ok_or_else(|| TargetError::Shape(text.to_owned()))?;
        let lower = kind.to_ascii_lowercase();
        let (resource, group) = lower.split_once('.').unwrap_or((&lower, ""));
        let kind = match (resource, group) {
            ("pod" | "pods" | "po", "") => TargetKind::Pod,
            ("deployment" | "deployments" | "deploy", "" | "apps") => TargetKind::Deployment,
            ("statefulset" | "statefulsets" | "sts", "" | "apps") => TargetKind::StatefulSet,
            ("daemonset" | "daemonsets" | "ds", "" | "apps") => TargetKind::DaemonSet,
            ("replicaset" | "replicasets" | "rs", "" | "apps") => TargetKind::ReplicaSet,
            ("job" | "jobs", "" | "batch") => TargetKind::Job,
            ("cronjob" | "cronjobs" | "cj", "" | "batch") => TargetKind::CronJob,
            _ => return Err(TargetError::Kind(kind.to_owned())),
        };
        Ok(Target {
            kind,
            name: name.to_owned(),
        })
    }
}

/// A Pod named as `check` takes it: `NAME` (as `kubectl logs` takes it), or `KIND/NAME` read
/// as `explain` reads it ([`Target`]: `pod/web-0`, `po/web-0`, `Pods/web-0`) naming a Pod, so
/// that both commands take a Pod in the same forms.
pub fn pod_name(text: &str) -> Result<String, TargetError> {
    if text.is_empty() {
        return Err(TargetError::Shape(text.to_owned()));
    }
    if !text.contains('/') {
        return Ok(text.to_owned());
    }
    let target: Target = text.parse()?;
    match target.kind {
        TargetKind::Pod => Ok(target.name),
        _ => Err(TargetError::NotPod(text.to_owned())),
    }
}

/// The namespace of the object explained.
#[derive(Clone, Debug)]
pub struct Namespace<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its labels, `None` when it is the operator's own (whose Pods the webhook never sees).
    pub labels: Option<&'a BTreeMap<String, String>>,
}

/// The explanation of `object` (a Pod or a workload, as the API server returned it) in
/// `namespace`, against `in_force`; the error says what is wrong with the object.
pub fn explain(
    object: Value,
    namespace: &Namespace<'_>,
    in_force: &[Arc<CompiledTemplate>],
) -> Result<String, String> {
    let kind = text_at(&object, "/kind").to_owned();
    let name = text_at(&object, "/metadata/name").to_owned();
    let title = format!("{}/{name} in {}", kind.to_lowercase(), namespace.name);
    let mut out = format!("{title}\n");
    match namespace.labels {
        Some(labels) => {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(out, "  namespace labels: {}", labels.join(","));
        }
        None => {
            let _ = writeln!(
                out,
                "  namespace {:?} is the operator's own: the webhook is never called for its Pods",
                namespace.name
            );
        }
    }
    if kind == "Pod" {
        out.push_str(&carried(&object, namespace, in_force));
        if let Some((owner, owner_name)) = object
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|o| o.get("controller") == Some(&Value::Bool(true)))
            .and_then(|o| Some((o.get("kind")?.as_str()?, o.get("name")?.as_str()?)))
            .filter(|(owner, _)| TargetKind::of_owner(owner).is_some())
        {
            let _ = writeln!(
                out,
                "  created by {}/{owner_name}: `kubectl sidecar explain {}/{owner_name} -n {}` shows what a Pod it creates now gets",
                owner.to_lowercase(),
                owner.to_lowercase(),
                namespace.name
            );
        }
    }
    let Some(labels) = namespace.labels else {
        return Ok(out);
    };
    let info = NamespaceInfo {
        name: namespace.name,
        labels: Some(labels),
    };
    let (mutated, plan) = plan_object(object, &info, in_force)?;
    let heading = if kind == "Pod" {
        "planned again now, as it is (what admission would decide for this Pod today)"
    } else {
        "planned now, as the Pod its controller would create"
    };
    out.push_str(&explain_plan(heading, &plan, in_force));
    out.push_str(&container_summary(&mutated));
    for warning in &plan.warnings {
        let _ = writeln!(out, "  warning  {warning}");
    }
    Ok(out)
}

/// What a Pod carries: its record, and where it stands with each template in force.
fn carried(pod: &Value, namespace: &Namespace<'_>, in_force: &[Arc<CompiledTemplate>]) -> String {
    let strings = |pointer: &str| -> BTreeMap<String, String> {
        pod.pointer(pointer)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect()
    };
    let labels = strings("/metadata/labels");
    let annotations = strings("/metadata/annotations");
    let meta = PodMeta {
        namespace: namespace.name,
        labels: &labels,
        annotations: &annotations,
    };
    let mut out = format!(
        "  carries ({INJECTED_ANNOTATION}): {}\n",
        annotations
            .get(INJECTED_ANNOTATION)
            .map_or("nothing", String::as_str)
    );
    let record: Vec<Recorded<'_>> = recorded(&annotations).collect();
    for template in in_force {
        let entry = record.iter().find(|e| e.name == template.name);
        let line = match standing(template, &meta, namespace.labels) {
            None => continue,
            Some(PodState::Current) => format!(
                "current  {} (generation {}: what it injects now)",
                template.name, template.generation
            ),
            Some(PodState::Stale { in_place }) => format!(
                "stale    {} (carries {}; in force: generation {}{})",
                template.name,
                entry.and_then(|e| e.generation).map_or_else(
                    || "an unknown version".to_owned(),
                    |g| format!("generation {g}")
                ),
                template.generation,
                if in_place {
                    ", only images changed since"
                } else {
                    ""
                }
            ),
            Some(PodState::Missing) => format!(
                "missing  {} (selects it, not carried: the Pod was created before it, or admitted without it)",
                template.name
            ),
        };
        let _ = writeln!(out, "  {line}");
    }
    for entry in &record {
        if !in_force.iter().any(|t| t.name == entry.name) {
            let _ = writeln!(
                out,
                "  gone     {} (no template of that name is in force)",
                entry.name
            );
        }
    }
    out
}

#[cfg(test)]
mod tests;
