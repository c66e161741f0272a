//! Reading Pods (as `kubectl get -o json` prints them) for assertions and the demo.

use serde_json::Value;

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
