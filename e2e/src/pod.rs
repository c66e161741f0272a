//! Reading Pods (as `kubectl get -o json` prints them) for assertions and the demo.

use serde_json::{Value, json};

use crate::ControlPlane;

/// The `name` of every item of a JSON list (containers, volumes, …); empty when absent.
pub fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item["name"].as_str().map(str::to_owned))
        .collect()
}

/// The Pod's container names, in order.
pub fn containers(pod: &Value) -> Vec<String> {
    names(&pod["spec"]["containers"])
}

/// The Pod's init container names, in order.
pub fn init_containers(pod: &Value) -> Vec<String> {
    names(&pod["spec"]["initContainers"])
}

/// Creates `pod` in `namespace` with a server-side dry run (admission runs, nothing is stored):
/// the Pod the API server would store, or its refusal.
pub fn dry_run_create(
    cp: &ControlPlane,
    namespace: &str,
    pod: &Value,
) -> anyhow::Result<Result<Value, String>> {
    dry_run(cp, "create", namespace, pod)
}

/// `kubectl VERB` (`create`, `replace`) of `pod` in `namespace` with a server-side dry run: the
/// Pod the API server would store, or its refusal.
pub fn dry_run(
    cp: &ControlPlane,
    verb: &str,
    namespace: &str,
    pod: &Value,
) -> anyhow::Result<Result<Value, String>> {
    let output = cp.kubectl_with_stdin(
        &[
            verb,
            "--dry-run=server",
            "-o",
            "json",
            "-n",
            namespace,
            "-f",
            "-",
        ],
        &pod.to_string(),
    )?;
    answer(&output)
}

/// What a kubectl call printing a Pod (`-o json`) answered: the Pod, or its refusal.
pub fn answer(output: &std::process::Output) -> anyhow::Result<Result<Value, String>> {
    if output.status.success() {
        Ok(Ok(serde_json::from_slice(&output.stdout)?))
    } else {
        Ok(Err(String::from_utf8_lossy(&output.stderr)
            .trim()
            .to_owned()))
    }
}

/// What two admissions of one Pod must agree on: labels, annotations and spec, with the random
/// suffix of the ServiceAccount token's volume (`kube-api-access-` and 5 characters) and the
/// namespace's name made fixed. A Pod author's volume of another name stays as it is.
pub fn stored_view(pod: &Value, namespace: &str) -> anyhow::Result<Value> {
    // `{{ pod.namespace }}` renders the namespace's name, which differs by design.
    let text = pod.to_string().replace(namespace, "NAMESPACE");
    let mut fixed = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find(TOKEN_VOLUME_PREFIX) {
        let end = at + TOKEN_VOLUME_PREFIX.len();
        fixed.push_str(&rest[..end]);
        rest = &rest[end..];
        let suffix = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        if suffix == 5 {
            fixed.push_str("xxxxx");
            rest = &rest[5..];
        }
    }
    fixed.push_str(rest);
    let pod: Value = serde_json::from_str(&fixed)?;
    Ok(json!({
        "labels": pod["metadata"]["labels"],
        "annotations": pod["metadata"]["annotations"],
        "spec": pod["spec"],
    }))
}

/// The prefix of the ServiceAccount token volume's name (its suffix is random).
pub const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";

/// A stored container with the ServiceAccount token's mount taken out (the plugin adds its own
/// to a copy made of it); without mounts then, without `volumeMounts`.
pub fn without_token_mount(item: &Value) -> Value {
    let mut item = item.clone();
    let Some(object) = item.as_object_mut() else {
        return item;
    };
    if let Some(Value::Array(mounts)) = object.get_mut("volumeMounts") {
        mounts.retain(|m| {
            !m["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(TOKEN_VOLUME_PREFIX))
        });
        if mounts.is_empty() {
            object.remove("volumeMounts");
        }
    }
    item
}
