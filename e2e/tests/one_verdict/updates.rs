//! Generated UPDATEs of an injected Pod: what an author (or a controller acting for one) can
//! change in a running Pod, alone or two at once — the sidecars' images, the record, resources
//! through `pods/resize`, and the changes that must stay allowed (the app's image, labels, an
//! opt-out annotation, a deadline, a toleration).
//!
//! Unlike the CREATE attempts, each UPDATE has a verdict known in advance: the after-admission
//! policy refuses whatever changes a required template's containers or its record entry, and
//! nothing else. Every backend must give that verdict (refusing with the policy's message) and
//! store the same Pod.

use std::time::Duration;

use injector_e2e::pod::{answer, dry_run, stored_view};
use injector_e2e::{ControlPlane, poll};
use serde_json::{Value, json};

use crate::generated::Draw;

/// The after-admission policy's name beside the operator's default policy name.
pub const AFTER_ADMISSION: &str = "sidecar-injector-after-admission";

/// One change to a running Pod.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Change {
    /// The required plain sidecar's image (`kubectl set image`).
    SidecarImage,
    /// The required native sidecar's image.
    NativeSidecarImage,
    /// Both sidecars' images changed and the record's entries rewritten to a newer generation:
    /// an imitation of an in-place update, which these templates (`OnCreate`) never get.
    ImitatedInPlace,
    /// The app container's image.
    AppImage,
    /// The record annotation removed.
    RecordRemoved,
    /// The `logs` entry of the record rewritten to another generation.
    RecordEntryForged,
    /// The `mesh` entry of the record dropped.
    RecordEntryDropped,
    /// A label added.
    Label,
    /// The opt-out annotation added (too late to matter, and allowed).
    OptOut,
    /// `activeDeadlineSeconds` set.
    Deadline,
    /// A toleration added.
    Toleration,
    /// The plain sidecar's CPU limit, through `pods/resize`.
    SidecarResize,
    /// The app's CPU limit, through `pods/resize`.
    AppResize,
}

impl Change {
    const ALL: [Change; 13] = [
        Change::SidecarImage,
        Change::NativeSidecarImage,
        Change::ImitatedInPlace,
        Change::AppImage,
        Change::RecordRemoved,
        Change::RecordEntryForged,
        Change::RecordEntryDropped,
        Change::Label,
        Change::OptOut,
        Change::Deadline,
        Change::Toleration,
        Change::SidecarResize,
        Change::AppResize,
    ];

    /// Whether the after-admission policy must refuse it.
    fn refused(self) -> bool {
        matches!(
            self,
            Change::SidecarImage
                | Change::NativeSidecarImage
                | Change::ImitatedInPlace
                | Change::RecordRemoved
                | Change::RecordEntryForged
                | Change::RecordEntryDropped
                | Change::SidecarResize
        )
    }

    /// Whether it goes through `pods/resize` (alone) rather than an UPDATE of the Pod.
    fn resize(self) -> bool {
        matches!(self, Change::SidecarResize | Change::AppResize)
    }

    /// `pod` (as stored) with the change made.
    fn apply(self, pod: &mut Value) {
        let set_image = |pod: &mut Value, list: &str, name: &str, image: &str| {
            if let Some(item) = pod["spec"][list]
                .as_array_mut()
                .and_then(|items| items.iter_mut().find(|c| c["name"] == name))
            {
                item["image"] = json!(image);
            }
        };
        let record = |pod: &mut Value, edit: &dyn Fn(&str) -> Option<String>| {
            let annotations = &mut pod["metadata"]["annotations"];
            let entries: Vec<String> = annotations["sidecar.dev/injected"]
                .as_str()
                .unwrap_or_default()
                .split(',')
                .filter_map(|e| edit(e.trim()))
                .collect();
            annotations["sidecar.dev/injected"] = json!(entries.join(","));
        };
        match self {
            Change::SidecarImage => {
                set_image(pod, "containers", "log-agent", "evil.invalid/agent:1");
            }
            Change::NativeSidecarImage => {
                set_image(pod, "initContainers", "mesh-proxy", "evil.invalid/proxy:1");
            }
            Change::ImitatedInPlace => {
                set_image(pod, "containers", "log-agent", "logs.invalid/agent:2");
                set_image(pod, "initContainers", "mesh-proxy", "mesh.invalid/proxy:2");
                record(pod, &|entry| {
                    let (name, rest) = entry.split_once('@')?;
                    let (_, fingerprint) = rest.split_once('#')?;
                    Some(format!("{name}@99#{fingerprint}"))
                });
            }
            Change::AppImage => set_image(pod, "containers", "app", "app.invalid/app:2"),
            Change::RecordRemoved => {
                if let Some(annotations) = pod["metadata"]["annotations"].as_object_mut() {
                    annotations.remove("sidecar.dev/injected");
                }
            }
            Change::RecordEntryForged => record(pod, &|entry| {
                Some(match entry.strip_prefix("logs@") {
                    Some(rest) => format!("logs@7{rest}"),
                    None => entry.to_owned(),
                })
            }),
            Change::RecordEntryDropped => {
                record(pod, &|entry| {
                    (!entry.starts_with("mesh@")).then(|| entry.to_owned())
                });
            }
            Change::Label => pod["metadata"]["labels"]["changed"] = json!("yes"),
            Change::OptOut => {
                pod["metadata"]["annotations"]["sidecar.dev/inject"] = json!("false");
            }
            Change::Deadline => pod["spec"]["activeDeadlineSeconds"] = json!(3600),
            Change::Toleration => {
                let toleration =
                    json!({"key": "changed", "operator": "Exists", "effect": "NoSchedule"});
                match pod["spec"]["tolerations"].as_array_mut() {
                    Some(tolerations) => tolerations.push(toleration),
                    None => pod["spec"]["tolerations"] = json!([toleration]),
                }
            }
            Change::SidecarResize | Change::AppResize => {}
        }
    }

    /// The strategic-merge patch of `pods/resize` for a resize change.
    pub fn resize_patch(self) -> Option<Value> {
        let name = match self {
            Change::SidecarResize => "log-agent",
            Change::AppResize => "app",
            _ => return None,
        };
        Some(json!({"spec": {"containers": [{
            "name": name,
            "resources": {"limits": {"cpu": "300m"}},
        }]}}))
    }
}

/// One generated UPDATE: its changes (one resize alone, or one or two others).
#[derive(Clone, Debug)]
pub struct Attempt {
    pub changes: Vec<Change>,
}

impl Attempt {
    /// Whether every backend must refuse it.
    pub fn refused(&self) -> bool {
        self.changes.iter().any(|c| c.refused())
    }

    /// The resize it is, if it is one.
    pub fn resize(&self) -> Option<Change> {
        self.changes.iter().copied().find(|c| c.resize())
    }

    /// `stored` with the changes made.
    pub fn applied(&self, stored: &Value) -> Value {
        let mut pod = stored.clone();
        for change in &self.changes {
            change.apply(&mut pod);
        }
        pod
    }

    pub fn name(&self) -> String {
        let names: Vec<String> = self.changes.iter().map(|c| format!("{c:?}")).collect();
        format!("update {}", names.join(" + "))
    }
}

/// `count` attempts: every change alone first, then drawn pairs (resizes stay alone).
pub fn attempts(draw: &mut Draw, count: usize) -> Vec<Attempt> {
    let mut attempts: Vec<Attempt> = Change::ALL
        .iter()
        .map(|&c| Attempt { changes: vec![c] })
        .collect();
    while attempts.len() < count {
        let first = Change::ALL[draw.below(Change::ALL.len())];
        let second = Change::ALL[draw.below(Change::ALL.len())];
        if first.resize() || second.resize() || first == second {
            continue;
        }
        attempts.push(Attempt {
            changes: vec![first, second],
        });
    }
    attempts
}

/// Under the running backend: creates the Pod `updated` in `namespace` for real, waits until
/// the after-admission policy refuses a sidecar's new image, tries each attempt as a
/// server-side dry run and deletes the Pod. The outcomes, as [`stored_view`]s or refusals.
pub fn outcomes(
    cp: &ControlPlane,
    namespace: &str,
    attempts: &[Attempt],
) -> Vec<Result<Value, String>> {
    let plain = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "updated"},
        "spec": {"containers": [{"name": "app", "image": "app.invalid/app:1"}]},
    });
    let created = cp
        .kubectl_with_stdin(
            &["create", "-o", "json", "-n", namespace, "-f", "-"],
            &plain.to_string(),
        )
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let stored: Value = serde_json::from_slice(&created.stdout).unwrap();
    let sidecar_image = Attempt {
        changes: vec![Change::SidecarImage],
    };
    poll(
        Duration::from_secs(30),
        "the after-admission policy to refuse a sidecar's new image",
        || {
            Ok(update(cp, namespace, &stored, &sidecar_image)
                .err()
                .filter(|refusal| refusal.contains(AFTER_ADMISSION)))
        },
    )
    .unwrap();
    let outcomes = attempts
        .iter()
        .map(|attempt| {
            update(cp, namespace, &stored, attempt)
                .map(|updated| stored_view(&updated, namespace).unwrap())
        })
        .collect();
    cp.kubectl_ok(&["delete", "pod", "updated", "-n", namespace, "--wait"])
        .unwrap();
    outcomes
}

/// `attempt` on `stored` as a server-side dry run: the Pod the API server would store, or its
/// refusal.
fn update(
    cp: &ControlPlane,
    namespace: &str,
    stored: &Value,
    attempt: &Attempt,
) -> Result<Value, String> {
    let Some(patch) = attempt.resize().and_then(Change::resize_patch) else {
        return dry_run(cp, "replace", namespace, &attempt.applied(stored)).unwrap();
    };
    let output = cp
        .kubectl(&[
            "patch",
            "pod",
            "updated",
            "-n",
            namespace,
            "--subresource=resize",
            "--type=strategic",
            &format!("--patch={patch}"),
            "--dry-run=server",
            "-o",
            "json",
        ])
        .unwrap();
    answer(&output).unwrap()
}
