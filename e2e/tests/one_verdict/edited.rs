//! A required template edited while Pods are created: under each backend, the `logs` template
//! gets a new image, or becomes one the policy cannot express (so it moves to the webhook under
//! `auto`, and refuses what it selects under `policy`), and a stream of Pods is created while
//! the edit travels through the operator, the policy, the guard and the API server's caches.
//!
//! Mid-way, either version may decide, but never neither: every Pod admitted carries one
//! version of the template whole (its sidecar and the rest as that version says) with that
//! version in its record, a look-alike is always refused, and a plain Pod is refused only
//! under `policy` (failing closed). Once settled, every backend gives the new version's verdict.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{TEMPLATES, app, create, exact_copy, named, pod};
use injector_e2e::{Backend, ControlPlane, poll};

/// The edit made to `logs`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Edit {
    /// A new image for its container.
    Image,
    /// `appContainers.envFrom` added: the policy cannot express it.
    WebhookOnly,
}

/// What distinguishes one version of `logs` in a stored Pod: its container's image, and
/// whether the app got its `envFrom`.
type Signature = (String, bool);

const OLD_IMAGE: &str = "logs.invalid/agent:1";
const NEW_IMAGE: &str = "logs.invalid/agent:2";

/// The `logs` template as [`TEMPLATES`] writes it.
pub fn original() -> String {
    TEMPLATES
        .split("\n---\n")
        .find(|doc| doc.contains("metadata: {name: logs}"))
        .unwrap()
        .to_owned()
}

impl Edit {
    fn edited(self) -> String {
        let logs = original();
        match self {
            Edit::Image => logs.replace(OLD_IMAGE, NEW_IMAGE),
            Edit::WebhookOnly => format!(
                "{}\n  appContainers:\n    envFrom: [{{configMapRef: {{name: logs-env, optional: true}}}}]\n",
                logs.trim_end()
            ),
        }
    }

    fn new_signature(self) -> Signature {
        match self {
            Edit::Image => (NEW_IMAGE.to_owned(), false),
            Edit::WebhookOnly => (OLD_IMAGE.to_owned(), true),
        }
    }
}

/// The signature of a stored Pod (as [`crate::create`] returns it), and the generation its
/// record gives `logs`.
fn signature(stored: &Value) -> (Option<Signature>, Option<i64>) {
    let agent = stored["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "log-agent");
    let app = stored["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "app");
    let env_from = app.is_some_and(|a| a["envFrom"].to_string().contains("logs-env"));
    let generation = stored["annotations"]["sidecar.dev/injected"]
        .as_str()
        .unwrap_or_default()
        .split(',')
        .find_map(|e| e.trim().strip_prefix("logs@"))
        .and_then(|rest| rest.split_once('#'))
        .and_then(|(generation, _)| generation.parse().ok());
    let signature = agent.map(|a| (a["image"].as_str().unwrap_or_default().to_owned(), env_from));
    (signature, generation)
}

fn generation(cp: &ControlPlane) -> i64 {
    cp.get_json("sidecartemplate", None, "logs").unwrap()["metadata"]["generation"]
        .as_i64()
        .unwrap()
}

/// Whether the operator has taken in generation `generation` of `logs`.
fn observed(cp: &ControlPlane, generation: i64) -> bool {
    cp.get_json("sidecartemplate", None, "logs").unwrap()["status"]["observedGeneration"]
        == json!(generation)
}

/// Edits `logs` under `backend` (the operator running) while Pods are created in `namespace`,
/// then puts it back; returns what went wrong.
pub fn edit_midway(
    cp: &ControlPlane,
    backend: Backend,
    namespace: &str,
    edit: Edit,
) -> Vec<String> {
    let mut problems = Vec::new();
    let name = "midway";
    let plain = pod(name, json!({"containers": [app()]}));
    let old = (OLD_IMAGE.to_owned(), false);
    let old_generation = generation(cp);
    let injected = settled(cp, namespace, &plain, old_generation, &old);
    let mut copy = exact_copy(&injected);
    copy["metadata"]["name"] = json!(name);
    let mut look_alike = copy.clone();
    look_alike["spec"]["containers"][1]["image"] = json!("evil.invalid/agent:1");
    assert_eq!(
        named(&look_alike, "containers", "log-agent")["image"],
        "evil.invalid/agent:1"
    );

    cp.apply_yaml(&edit.edited()).unwrap();
    let new_generation = generation(cp);
    let versions = [
        (old_generation, old),
        (new_generation, edit.new_signature()),
    ];
    let fails_closed = backend == Backend::Policy && edit == Edit::WebhookOnly;
    let what = format!("{} {edit:?}", backend.arg());

    // Mid-way: every admitted Pod carries one version whole.
    let check = |who: &str, result: &Result<Value, String>, problems: &mut Vec<String>| match result
    {
        Ok(stored) => {
            let (signature, generation) = signature(stored);
            let version = versions.iter().find(|(g, _)| Some(*g) == generation);
            match (signature, version) {
                (Some(signature), Some((_, expected))) if &signature == expected => {}
                (signature, _) => problems.push(format!(
                    "{what}: the {who} was admitted with {signature:?} and logs@{generation:?} in its record: {stored}"
                )),
            }
            if who == "look-alike" {
                problems.push(format!("{what}: the look-alike was admitted: {stored}"));
            }
        }
        Err(refusal) if who == "plain Pod" && !fails_closed => {
            problems.push(format!(
                "{what}: a plain Pod was refused mid-way: {refusal}"
            ));
        }
        Err(_) => {}
    };
    let started = Instant::now();
    let mut settled_rounds = 0;
    let mut last = Vec::new();
    while settled_rounds < 3 {
        if started.elapsed() > Duration::from_secs(120) {
            problems.push(format!("{what}: not settled in 120 s; last: {last:?}"));
            break;
        }
        last = [
            ("plain Pod", &plain),
            ("old copy", &copy),
            ("look-alike", &look_alike),
        ]
        .into_iter()
        .map(|(who, pod)| {
            let result = create(cp, namespace, pod);
            check(who, &result, &mut problems);
            result
        })
        .collect();
        // Settled: the operator has the new generation and a plain Pod gets its verdict.
        let plain_settled = match &last[0] {
            Ok(stored) => !fails_closed && signature(stored).1 == Some(new_generation),
            Err(_) => fails_closed,
        };
        if plain_settled && observed(cp, new_generation) {
            settled_rounds += 1;
        } else {
            settled_rounds = 0;
        }
    }
    eprintln!(
        "[one-verdict] {what}: settled in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // Settled: the new version's verdict. An old copy of an older image is a look-alike; one of
    // an unchanged container gets the new version's rest.
    let copy_admitted = edit == Edit::WebhookOnly && !fails_closed;
    if last.get(1).is_some_and(|r| r.is_ok() != copy_admitted) {
        problems.push(format!(
            "{what}: settled, the old copy: {:?} (admitted expected: {copy_admitted})",
            last[1]
        ));
    }
    cp.apply_yaml(&original()).unwrap();
    settled(cp, namespace, &plain, generation(cp), &versions[0].1);
    problems
}

/// Waits (up to 60 s) until `plain` is admitted with generation `generation` of `logs`, whose
/// signature must be `expected`; returns the stored Pod.
fn settled(
    cp: &ControlPlane,
    namespace: &str,
    plain: &Value,
    generation: i64,
    expected: &Signature,
) -> Value {
    let stored = poll(
        Duration::from_secs(60),
        &format!("a plain Pod injected with logs@{generation}"),
        || {
            Ok(create(cp, namespace, plain)
                .ok()
                .filter(|stored| signature(stored).1 == Some(generation)))
        },
    )
    .unwrap();
    assert_eq!(signature(&stored).0.as_ref(), Some(expected), "{stored}");
    stored
}
