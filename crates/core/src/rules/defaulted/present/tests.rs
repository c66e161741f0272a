//! The presence rule's two forms on generated containers: [`difference`] as `plan` judges a
//! container already in the Pod, and [`container_presence`] evaluated by a CEL interpreter
//! (`kube-cel`) as the webhook entries' presence conditions and the guard carry it. The Pod's
//! container is the template's as the API server stores it, with what admission plugins add
//! (the token's mount, a LimitRange's resources, `Always`, a hostNetwork Pod's `hostPort`s)
//! and at most one change a look-alike would make. Both forms must agree on every input.

use kube_cel::cel;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::super::{ItemKind, SERVICE_ACCOUNT_MOUNT_PATH, Surroundings, difference};
use super::container_presence;
use crate::cel::testing::{context, typed};
use crate::placeholder::{Node, TemplateString};

const TOKEN_VOLUME: &str = "kube-api-access-q2w9z";

/// A template's container: the parts each generated case may set.
#[derive(Clone, Debug)]
struct Ours {
    image: &'static str,
    pull_policy: Option<&'static str>,
    args: Option<Vec<&'static str>>,
    env: Vec<(&'static str, &'static str)>,
    port: Option<i64>,
    requests_cpu: Option<&'static str>,
    mount: bool,
}

/// What admission plugins add to the stored container in the Pod under admission.
#[derive(Clone, Copy, Debug)]
struct Added {
    token_mount: bool,
    limit_range: bool,
    always_pull: bool,
    host_network: bool,
}

/// The one change a look-alike makes, if any.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Change {
    None,
    Image,
    ExtraEnv,
    EnvValue,
    WorkingDir,
    Command,
    PortNumber,
    MountPath,
    PullPolicy,
}

fn ours() -> impl Strategy<Value = Ours> {
    (
        prop::sample::select(vec![
            "agents.invalid/agent:1.2",
            "agents.invalid/agent:latest",
            "agents.invalid/agent",
        ]),
        prop::option::of(prop::sample::select(vec![
            "IfNotPresent",
            "Never",
            "Always",
        ])),
        prop::option::of(prop::sample::subsequence(
            vec!["--verbose", "--port=9100", "run"],
            0..3,
        )),
        prop::sample::subsequence(vec![("MODE", "mass"), ("LEVEL", ""), ("ZONE", "a")], 0..3),
        prop::option::of(prop::sample::select(vec![9100_i64, 8080])),
        prop::option::of(prop::sample::select(vec!["10m", "1"])),
        any::<bool>(),
    )
        .prop_map(
            |(image, pull_policy, args, env, port, requests_cpu, mount)| Ours {
                image,
                pull_policy,
                args,
                env,
                port,
                requests_cpu,
                mount,
            },
        )
}

fn added() -> impl Strategy<Value = Added> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |(token_mount, limit_range, always_pull, host_network)| Added {
            token_mount,
            limit_range,
            always_pull,
            host_network,
        },
    )
}

fn change() -> impl Strategy<Value = Change> {
    prop::sample::select(vec![
        Change::None,
        Change::None,
        Change::None,
        Change::Image,
        Change::ExtraEnv,
        Change::EnvValue,
        Change::WorkingDir,
        Change::Command,
        Change::PortNumber,
        Change::MountPath,
        Change::PullPolicy,
    ])
}

/// The template's container, as the template writes it.
fn template_container(ours: &Ours) -> Value {
    let mut container = Map::new();
    container.insert("name".into(), json!("agent"));
    container.insert("image".into(), json!(ours.image));
    if let Some(policy) = ours.pull_policy {
        container.insert("imagePullPolicy".into(), json!(policy));
    }
    if let Some(args) = &ours.args {
        container.insert("args".into(), json!(args));
    }
    if !ours.env.is_empty() {
        let env: Vec<Value> = ours
            .env
            .iter()
            .map(|(name, value)| json!({"name": name, "value": value}))
            .collect();
        container.insert("env".into(), Value::Array(env));
    }
    if let Some(port) = ours.port {
        container.insert(
            "ports".into(),
            json!([{"containerPort": port, "name": "metrics"}]),
        );
    }
    if let Some(cpu) = ours.requests_cpu {
        container.insert("resources".into(), json!({"requests": {"cpu": cpu}}));
    }
    if ours.mount {
        container.insert(
            "volumeMounts".into(),
            json!([{"name": "data", "mountPath": "/data"}]),
        );
    }
    Value::Object(container)
}

/// `container` as the API server stores it: its defaults filled in (`SetDefaults_Container`
/// and `SetDefaults_ContainerPort`, for the fields these cases set), an empty `value` left
/// out, and `resources: {}` when none are set.
fn stored(container: &Value) -> Value {
    let mut stored = container.clone();
    let fields = stored.as_object_mut().unwrap();
    fields
        .entry("terminationMessagePath")
        .or_insert(json!("/dev/termination-log"));
    fields
        .entry("terminationMessagePolicy")
        .or_insert(json!("File"));
    let image = fields["image"].as_str().unwrap();
    let tag = image.rsplit_once(':').map(|(_, tag)| tag);
    let policy = if matches!(tag, None | Some("latest")) {
        "Always"
    } else {
        "IfNotPresent"
    };
    fields.entry("imagePullPolicy").or_insert(json!(policy));
    fields.entry("resources").or_insert(json!({}));
    if let Some(Value::Array(ports)) = fields.get_mut("ports") {
        for port in ports {
            port.as_object_mut()
                .unwrap()
                .entry("protocol")
                .or_insert(json!("TCP"));
        }
    }
    if let Some(Value::Array(env)) = fields.get_mut("env") {
        for var in env {
            if var["value"] == "" {
                var.as_object_mut().unwrap().remove("value");
            }
        }
    }
    stored
}

/// The Pod's container: `stored` with what admission plugins add and `change`.
fn in_pod(stored: &Value, added: Added, change: Change) -> Value {
    let mut container = stored.clone();
    let fields = container.as_object_mut().unwrap();
    if added.token_mount {
        let mounts = fields
            .entry("volumeMounts")
            .or_insert(json!([]))
            .as_array_mut()
            .unwrap();
        mounts.push(json!({"name": TOKEN_VOLUME, "readOnly": true, "mountPath": SERVICE_ACCOUNT_MOUNT_PATH}));
    }
    if added.limit_range {
        let resources = fields["resources"].as_object_mut().unwrap();
        resources.insert("limits".into(), json!({"memory": "64Mi"}));
    }
    if added.always_pull {
        fields.insert("imagePullPolicy".into(), json!("Always"));
    }
    if added.host_network
        && let Some(Value::Array(ports)) = fields.get_mut("ports")
    {
        for port in ports {
            let container_port = port["containerPort"].clone();
            port.as_object_mut()
                .unwrap()
                .insert("hostPort".into(), container_port);
        }
    }
    match change {
        Change::None => {}
        Change::Image => {
            fields.insert("image".into(), json!("agents.invalid/other:1.2"));
        }
        Change::ExtraEnv => {
            let env = fields
                .entry("env")
                .or_insert(json!([]))
                .as_array_mut()
                .unwrap();
            env.push(json!({"name": "INJECTED_BY", "value": "someone"}));
        }
        Change::EnvValue => match fields.get_mut("env") {
            Some(Value::Array(env)) => env[0]["value"] = json!("changed"),
            _ => {
                fields.insert("env".into(), json!([{"name": "MODE", "value": "x"}]));
            }
        },
        Change::WorkingDir => {
            fields.insert("workingDir".into(), json!("/srv"));
        }
        Change::Command => {
            fields.insert("command".into(), json!(["/bin/sh"]));
        }
        Change::PortNumber => {
            fields.insert(
                "ports".into(),
                json!([{"containerPort": 7000, "name": "metrics", "protocol": "TCP"}]),
            );
        }
        Change::MountPath => {
            fields.insert(
                "volumeMounts".into(),
                json!([{"name": "data", "mountPath": "/elsewhere"}]),
            );
        }
        Change::PullPolicy => {
            // Neither the stored policy nor the `Always` a plugin may set.
            let other = if stored["imagePullPolicy"] == "Never" {
                "IfNotPresent"
            } else {
                "Never"
            };
            fields.insert("imagePullPolicy".into(), json!(other));
        }
    }
    container
}

/// Placeholders as the policy renders them; these cases hold none.
fn text(template: &TemplateString) -> String {
    panic!("no placeholder expected: {template:?}")
}

/// The CEL form's verdict on `pod`.
fn cel_present(body: &Node, stored: &Value, pod: &Value) -> bool {
    let source = container_presence("containers", body, stored, "[]", &text)
        .unwrap_or_else(|| panic!("no condition for {stored}"));
    let program = cel::parser::Parser::new()
        .enable_optional_syntax(true)
        .parse(&source)
        .unwrap_or_else(|e| panic!("{source}: {e:?}"));
    let mut context = context();
    context.add_variable_from_value("object", typed(pod));
    match context.resolve(&program) {
        Ok(cel::Value::Bool(verdict)) => verdict,
        other => panic!("{source}: {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    #[test]
    fn the_rust_and_cel_forms_of_presence_agree(ours in ours(), added in added(), change in change()) {
        let template = template_container(&ours);
        let stored = stored(&template);
        let container = in_pod(&stored, added, change);
        let pod = json!({
            "metadata": {"name": "web-1", "labels": {}, "annotations": {}},
            "spec": {
                "hostNetwork": added.host_network,
                "containers": [{"name": "app", "image": "app.invalid/app:1"}, container],
                "volumes": [{"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
            },
        });
        let surroundings = Surroundings {
            host_network: added.host_network,
            token_volumes: &[TOKEN_VOLUME],
        };
        let rust = difference(&template, &container, ItemKind::Container, &surroundings);
        let body = Node::parse(&template, "container", &mut Vec::new());
        let cel = cel_present(&body, &stored, &pod);
        prop_assert_eq!(rust.is_none(), cel, "Rust says {:?}; the Pod's container: {}", rust, container);
        // Neither form takes a look-alike for the template's, nor refuses what the API server
        // and its plugins made of it.
        prop_assert_eq!(cel, change == Change::None, "the Pod's container: {}", container);
    }
}
