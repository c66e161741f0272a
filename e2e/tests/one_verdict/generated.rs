//! Generated Pod-author attempts: an exact copy of what the webhook injects (or a plain Pod),
//! changed in one to three ways drawn from what an author can write: a look-alike in any
//! container field, extra mounts and volumes, positions and orders, names colliding with the
//! templates' items, forged records, opt-outs, `generateName`, `hostNetwork`, the token's
//! volume. Nobody decides here what the verdict must be: every backend and `render` must give
//! the webhook's.
//!
//! The draw is seeded (`SIDECAR_INJECTOR_E2E_SEED`, printed), so a failure replays.

use serde_json::{Value, json};

/// A small deterministic generator (xorshift64*): the same seed, the same cases.
pub struct Draw(u64);

impl Draw {
    pub fn new(seed: u64) -> Self {
        Draw(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The seed: `SIDECAR_INJECTOR_E2E_SEED`, or one of today's.
pub fn seed() -> u64 {
    std::env::var("SIDECAR_INJECTOR_E2E_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
        })
}

/// Where a generated Pod's sidecar copies are.
const SIDECARS: [(&str, &str); 2] = [
    ("containers", "log-agent"),
    ("initContainers", "mesh-proxy"),
];

fn item<'a>(pod: &'a mut Value, list: &str, name: &str) -> Option<&'a mut Value> {
    pod["spec"][list]
        .as_array_mut()?
        .iter_mut()
        .find(|c| c["name"] == name)
}

fn push(target: &mut Value, key: &str, value: Value) {
    if !target[key].is_array() {
        target[key] = json!([]);
    }
    if let Some(list) = target[key].as_array_mut() {
        list.push(value);
    }
}

/// A change to one field of a sidecar copy: a look-alike.
fn change_field(draw: &mut Draw, pod: &mut Value) -> String {
    let &(list, name) = draw.pick(&SIDECARS);
    let Some(sidecar) = item(pod, list, name) else {
        return "nothing (no copy)".into();
    };
    let change = draw.below(16);
    match change {
        0 => sidecar["image"] = json!("evil.invalid/agent:1"),
        1 => sidecar["args"] = json!(["--evil"]),
        2 => sidecar["command"] = json!(["/bin/sh", "-c", "true"]),
        3 => push(sidecar, "env", json!({"name": "EXTRA", "value": "1"})),
        4 => push(sidecar, "ports", json!({"containerPort": 9999})),
        5 => sidecar["securityContext"] = json!({"privileged": true}),
        6 => sidecar["resources"] = json!({"limits": {"cpu": "1"}}),
        7 => push(
            sidecar,
            "volumeMounts",
            json!({"name": "mesh-config", "mountPath": "/evil"}),
        ),
        8 => sidecar["workingDir"] = json!("/tmp"),
        9 => {
            sidecar["lifecycle"] = json!({"postStart": {"exec": {"command": ["/bin/true"]}}});
        }
        10 => push(
            sidecar,
            "envFrom",
            json!({"configMapRef": {"name": "evil"}}),
        ),
        11 => sidecar["stdin"] = json!(true),
        12 => sidecar["imagePullPolicy"] = json!("Never"),
        13 => sidecar["terminationMessagePath"] = json!("/evil"),
        14 => {
            sidecar["startupProbe"] = json!({"tcpSocket": {"port": 9999}});
        }
        _ => {
            if let Some(fields) = sidecar.as_object_mut() {
                fields.remove("ports");
                fields.remove("args");
            }
        }
    }
    format!("{name}: field change {change}")
}

/// Where the copies stand, and next to what.
fn reorder(draw: &mut Draw, pod: &mut Value) -> String {
    let change = draw.below(5);
    let spec = &mut pod["spec"];
    match change {
        // The sidecar before the app.
        0 => {
            if let Some(containers) = spec["containers"].as_array_mut() {
                containers.reverse();
            }
        }
        // The Pod's own plain init container before the native sidecar.
        1 => {
            let own = json!({"name": "setup", "image": "app.invalid/setup:1"});
            if !spec["initContainers"].is_array() {
                spec["initContainers"] = json!([]);
            }
            if let Some(init) = spec["initContainers"].as_array_mut() {
                init.insert(0, own);
            }
        }
        // ... and after it.
        2 => push(
            spec,
            "initContainers",
            json!({"name": "setup", "image": "app.invalid/setup:1"}),
        ),
        // The native sidecar as a plain container.
        3 => {
            let proxy = spec["initContainers"].as_array_mut().and_then(|init| {
                let at = init.iter().position(|c| c["name"] == "mesh-proxy")?;
                Some(init.remove(at))
            });
            if let Some(mut proxy) = proxy {
                if let Some(fields) = proxy.as_object_mut() {
                    fields.remove("restartPolicy");
                }
                push(spec, "containers", proxy);
            }
        }
        // The app renamed like another template's container.
        _ => {
            if let Some(app) = spec["containers"]
                .as_array_mut()
                .and_then(|c| c.iter_mut().find(|c| c["name"] == "app"))
            {
                app["name"] = json!("elsewhere-agent");
            }
        }
    }
    format!("reorder {change}")
}

/// The Pod's volumes and mounts.
fn volumes(draw: &mut Draw, pod: &mut Value) -> String {
    let change = draw.below(6);
    let spec = &mut pod["spec"];
    let set = |spec: &mut Value, name: &str, volume: Value| {
        let Some(list) = spec["volumes"].as_array_mut() else {
            spec["volumes"] = json!([volume]);
            return;
        };
        match list.iter_mut().find(|v| v["name"] == name) {
            Some(found) => *found = volume,
            None => list.push(volume),
        }
    };
    match change {
        0 => set(
            spec,
            "mesh-config",
            json!({"name": "mesh-config", "hostPath": {"path": "/etc"}}),
        ),
        1 => set(
            spec,
            "mesh-ca",
            json!({"name": "mesh-ca", "configMap": {"name": "my-own-ca"}}),
        ),
        2 => set(
            spec,
            "mesh-ca",
            json!({"name": "mesh-ca", "configMap": {"name": "mesh-ca", "optional": true, "defaultMode": 420}}),
        ),
        3 => set(spec, "mesh-config", json!({"name": "mesh-config"})),
        // A volume of the author's own, mounted into the sidecar.
        4 => {
            set(spec, "extra", json!({"name": "extra", "emptyDir": {}}));
            if let Some(agent) = item(pod, "containers", "log-agent") {
                push(
                    agent,
                    "volumeMounts",
                    json!({"name": "extra", "mountPath": "/extra"}),
                );
            }
        }
        // A token volume of the author's own, mounted where the token goes.
        _ => {
            set(
                spec,
                "kube-api-access-forge",
                json!({"name": "kube-api-access-forge", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "audience": "elsewhere"}},
                ]}}),
            );
            if let Some(agent) = item(pod, "containers", "log-agent") {
                push(
                    agent,
                    "volumeMounts",
                    json!({"name": "kube-api-access-forge", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}),
                );
            }
        }
    }
    format!("volumes {change}")
}

/// Metadata and Pod-wide fields.
fn pod_wide(draw: &mut Draw, pod: &mut Value, record: &str) -> String {
    let change = draw.below(7);
    match change {
        0 => pod["metadata"]["annotations"] = json!({"sidecar.dev/injected": record}),
        1 => pod["metadata"]["annotations"] = json!({"sidecar.dev/inject": "false"}),
        2 => pod["metadata"]["labels"] = json!({"sidecar.dev/inject": "false"}),
        3 => {
            if let Some(metadata) = pod["metadata"].as_object_mut() {
                let name = metadata.remove("name").unwrap_or(json!("generated"));
                metadata.insert(
                    "generateName".into(),
                    json!(format!("{}-", name.as_str().unwrap_or("g"))),
                );
            }
        }
        4 => pod["spec"]["hostNetwork"] = json!(true),
        5 => pod["spec"]["automountServiceAccountToken"] = json!(false),
        _ => {
            if let Some(app) = item(pod, "containers", "app") {
                push(app, "env", json!({"name": "MESH", "value": "off"}));
            }
        }
    }
    format!("pod-wide {change}")
}

/// `count` attempts: (what was done, the Pod). `copy` is the exact copy of what the webhook
/// injected, `plain` the Pod it was injected into, `record` its `sidecar.dev/injected`.
pub fn attempts(
    draw: &mut Draw,
    count: usize,
    copy: &Value,
    plain: &Value,
    record: &str,
) -> Vec<(String, Value)> {
    (0..count)
        .map(|index| {
            let from_copy = draw.below(3) != 0;
            let mut pod = if from_copy {
                copy.clone()
            } else {
                plain.clone()
            };
            let name = format!("generated-{index}");
            // The copy's own placeholder (`--pod {{ pod.name }}`) rendered for this Pod.
            if let Some(agent) = item(&mut pod, "containers", "log-agent") {
                agent["args"] = json!(["--pod", name]);
            }
            pod["metadata"]["name"] = json!(&name);
            let mut done = vec![
                name.clone(),
                if from_copy { "copy" } else { "plain" }.to_owned(),
            ];
            for _ in 0..=draw.below(3) {
                done.push(match draw.below(if from_copy { 4 } else { 2 }) {
                    0 => pod_wide(draw, &mut pod, record),
                    1 => volumes(draw, &mut pod),
                    2 => change_field(draw, &mut pod),
                    _ => reorder(draw, &mut pod),
                });
            }
            (done.join(", "), pod)
        })
        .collect()
}
