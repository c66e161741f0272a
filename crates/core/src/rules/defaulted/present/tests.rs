//! The presence rule's two forms on generated containers: [`difference`] as `plan` judges a
//! container already in the Pod (with, for a native sidecar, where it stands: `placement`),
//! and [`container_presence`] evaluated by a CEL interpreter (`kube-cel`) as the webhook
//! entries' presence conditions and the guard carry it. The Pod's container is the template's
//! as the API server stores it, with what the API server and admission plugins add (the
//! token's mount, a LimitRange's resources, `Always`, a hostNetwork Pod's `hostPort`s) and at
//! most one change a look-alike would make; a native sidecar stands among generated init
//! containers. A second property has placeholders in the container, rendered by the proof
//! for its own Pod and by the Pod under admission for itself (empty or not). Both forms must
//! agree on every input, and both must take the template's container, and only it, for the
//! template's. On the same inputs, the other CEL form, [`holds_cel`] (the template's side),
//! must hold wherever `difference` finds no difference.

use kube_cel::cel;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::super::{ItemKind, SERVICE_ACCOUNT_MOUNT_PATH, Surroundings, difference, holds_cel};
use super::container_presence;
use crate::cel::cel_list;
use crate::cel::testing::evaluate;
use crate::placeholder::{Node, Part, TemplateString};
use crate::rules::placement::{Before, first_blocking};

/// The Pod's ServiceAccount token volume, which the ServiceAccount plugin mounts.
const TOKEN_VOLUME: &str = "kube-api-access-q2w9z";
/// A projected volume named like the plugin's that holds no token: a Pod author's.
const FAKE_TOKEN_VOLUME: &str = "kube-api-access-fake";

/// A template's container: the parts each generated case may set.
#[derive(Clone, Debug)]
struct Ours {
    image: &'static str,
    pull_policy: Option<&'static str>,
    command: Option<Vec<&'static str>>,
    args: Option<Vec<&'static str>>,
    env: Vec<Env>,
    port: Option<Port>,
    requests_cpu: Option<&'static str>,
    limits_memory: Option<&'static str>,
    probe: Option<Probe>,
    mount: Option<Mount>,
    /// An init container with `restartPolicy: Always`, among the Pod's init containers.
    native_sidecar: bool,
}

#[derive(Clone, Copy, Debug)]
enum Env {
    Value(&'static str, &'static str),
    /// `valueFrom.fieldRef`, whose `apiVersion` the API server fills in.
    FieldRef(&'static str),
}

#[derive(Clone, Copy, Debug)]
struct Port {
    number: i64,
    protocol: Option<&'static str>,
    /// `hostPort: 0`, which the API server drops, or on a hostNetwork Pod defaults.
    host_port_zero: bool,
}

/// A readiness probe on port 9100, its zeros (which the API server defaults) or nothing.
#[derive(Clone, Copy, Debug)]
enum Probe {
    Plain,
    Zeros,
}

/// The template's one mount, `data` at `/data`, with `readOnly` as given.
#[derive(Clone, Copy, Debug)]
struct Mount {
    read_only: Option<bool>,
}

/// What the API server and admission plugins add to the stored container in the Pod under
/// admission.
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
    ExtraArg,
    PortNumber,
    ExtraPort,
    MountPath,
    ExtraMount,
    PullPolicy,
    /// A request of its own; what a LimitRange could have set where the template sets none.
    RequestsCpu,
    ProbePeriod,
    SecurityContext,
    TerminationMessagePath,
    /// A native sidecar made plain, or a container made a native sidecar.
    RestartPolicy,
    /// A read-only mount at the token's path of a volume named like the token's, holding none.
    FakeTokenMount,
    /// The token's volume mounted at the token's path, writable.
    WritableTokenMount,
    /// The token's volume mounted at the token's path, only part of it.
    TokenSubPath,
}

/// An init container standing before a native sidecar of the template's.
#[derive(Clone, Copy, Debug)]
struct Init {
    native_sidecar: bool,
    /// A template's (the CEL knows it by name, `plan` by content).
    templates: bool,
}

fn ours() -> impl Strategy<Value = Ours> {
    let env = prop::sample::subsequence(
        vec![
            Env::Value("MODE", "mass"),
            Env::Value("LEVEL", ""),
            Env::FieldRef("metadata.name"),
        ],
        0..=3,
    );
    let port = (
        prop::sample::select(vec![9100_i64, 8080]),
        prop::option::of(prop::sample::select(vec!["TCP", "UDP"])),
        any::<bool>(),
    )
        .prop_map(|(number, protocol, host_port_zero)| Port {
            number,
            protocol,
            host_port_zero,
        });
    let probe = prop::sample::select(vec![Probe::Plain, Probe::Zeros]);
    let mount = prop::option::of(any::<bool>()).prop_map(|read_only| Mount { read_only });
    (
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
            prop::option::of(prop::sample::select(vec![
                vec!["/agent"],
                vec!["/agent", "serve"],
            ])),
            prop::option::of(prop::sample::subsequence(
                vec!["--verbose", "--port=9100", "run"],
                0..=3,
            )),
            env,
        ),
        (
            prop::option::of(port),
            prop::option::of(prop::sample::select(vec!["10m", "0.5", "1"])),
            prop::option::of(prop::sample::select(vec!["64Mi", "1024Mi"])),
            prop::option::of(probe),
            prop::option::of(mount),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (image, pull_policy, command, args, env),
                (port, requests_cpu, limits_memory, probe, mount, native_sidecar),
            )| Ours {
                image,
                pull_policy,
                command,
                args,
                env,
                port,
                requests_cpu,
                limits_memory,
                probe,
                mount,
                native_sidecar,
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
    use Change::*;
    prop::sample::select(vec![
        None,
        None,
        None,
        None,
        None,
        Image,
        ExtraEnv,
        EnvValue,
        WorkingDir,
        Command,
        ExtraArg,
        PortNumber,
        ExtraPort,
        MountPath,
        ExtraMount,
        PullPolicy,
        RequestsCpu,
        ProbePeriod,
        SecurityContext,
        TerminationMessagePath,
        RestartPolicy,
        FakeTokenMount,
        WritableTokenMount,
        TokenSubPath,
    ])
}

/// The init containers before a native sidecar: most often none or templates' only, so that
/// the container's own content decides most cases.
fn before() -> impl Strategy<Value = Vec<Init>> {
    prop::collection::vec(
        (any::<bool>(), prop::bool::weighted(0.7)).prop_map(|(native_sidecar, templates)| Init {
            native_sidecar,
            templates,
        }),
        0..=2,
    )
}

/// The template's container, as the template writes it.
fn template_container(ours: &Ours) -> Value {
    let mut container = Map::new();
    container.insert("name".into(), json!("agent"));
    container.insert("image".into(), json!(ours.image));
    if let Some(policy) = ours.pull_policy {
        container.insert("imagePullPolicy".into(), json!(policy));
    }
    if let Some(command) = &ours.command {
        container.insert("command".into(), json!(command));
    }
    if let Some(args) = &ours.args {
        container.insert("args".into(), json!(args));
    }
    if !ours.env.is_empty() {
        let env: Vec<Value> = ours
            .env
            .iter()
            .map(|env| match env {
                Env::Value(name, value) => json!({"name": name, "value": value}),
                Env::FieldRef(path) => {
                    json!({"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": path}}})
                }
            })
            .collect();
        container.insert("env".into(), Value::Array(env));
    }
    if let Some(port) = ours.port {
        let mut fields = json!({"containerPort": port.number, "name": "metrics"});
        if let Some(protocol) = port.protocol {
            fields["protocol"] = json!(protocol);
        }
        if port.host_port_zero {
            fields["hostPort"] = json!(0);
        }
        container.insert("ports".into(), json!([fields]));
    }
    let mut resources = Map::new();
    if let Some(cpu) = ours.requests_cpu {
        resources.insert("requests".into(), json!({"cpu": cpu}));
    }
    if let Some(memory) = ours.limits_memory {
        resources.insert("limits".into(), json!({"memory": memory}));
    }
    if !resources.is_empty() {
        container.insert("resources".into(), Value::Object(resources));
    }
    match ours.probe {
        None => {}
        Some(Probe::Plain) => {
            container.insert("readinessProbe".into(), json!({"httpGet": {"port": 9100}}));
        }
        Some(Probe::Zeros) => {
            container.insert(
                "readinessProbe".into(),
                json!({"httpGet": {"port": 9100, "path": "", "scheme": ""}, "timeoutSeconds": 0, "periodSeconds": 0}),
            );
        }
    }
    if let Some(mount) = ours.mount {
        let mut fields = json!({"name": "data", "mountPath": "/data"});
        if let Some(read_only) = mount.read_only {
            fields["readOnly"] = json!(read_only);
        }
        container.insert("volumeMounts".into(), json!([fields]));
    }
    if ours.native_sidecar {
        container.insert("restartPolicy".into(), json!("Always"));
    }
    Value::Object(container)
}

/// `container` as the API server stores it, for the fields these cases set: Go's encoder
/// leaves out empty lists and strings and the zeros of plain fields (`hostPort: 0`,
/// `readOnly: false`); `SetDefaults_Container`, `SetDefaults_ContainerPort`,
/// `SetDefaults_Probe`, `SetDefaults_HTTPGetAction` and `SetDefaults_ObjectFieldSelector`
/// fill in their defaults; `SetDefaults_Pod` copies limits into the requests a container does
/// not set; quantities are written in canonical form; `resources: {}` stands when none are
/// set. Test-only, and written to what these generators produce: the proof's dry run learns
/// the real defaults from the API server itself.
fn stored(container: &Value) -> Value {
    let mut stored = container.clone();
    let fields = stored.as_object_mut().unwrap();
    fields.retain(|_, value| match value {
        Value::Array(items) => !items.is_empty(),
        Value::String(text) => !text.is_empty(),
        _ => true,
    });
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
    let resources = fields.entry("resources").or_insert(json!({}));
    let resources = resources.as_object_mut().unwrap();
    for quantities in resources.values_mut() {
        for quantity in quantities.as_object_mut().unwrap().values_mut() {
            *quantity = json!(canonical(quantity.as_str().unwrap()));
        }
    }
    if let Some(limits) = resources.get("limits").cloned() {
        let requests = resources.entry("requests").or_insert(json!({}));
        for (name, quantity) in limits.as_object().unwrap() {
            requests
                .as_object_mut()
                .unwrap()
                .entry(name.clone())
                .or_insert(quantity.clone());
        }
    }
    if let Some(Value::Array(ports)) = fields.get_mut("ports") {
        for port in ports {
            let port = port.as_object_mut().unwrap();
            port.entry("protocol").or_insert(json!("TCP"));
            if port.get("hostPort") == Some(&json!(0)) {
                port.remove("hostPort");
            }
        }
    }
    if let Some(Value::Array(env)) = fields.get_mut("env") {
        for var in env {
            if var["value"] == "" {
                var.as_object_mut().unwrap().remove("value");
            }
            if let Some(field_ref) = var.pointer_mut("/valueFrom/fieldRef") {
                field_ref["apiVersion"] = json!("v1");
            }
        }
    }
    if let Some(probe) = fields.get_mut("readinessProbe") {
        let probe = probe.as_object_mut().unwrap();
        for (key, default) in [
            ("timeoutSeconds", 1),
            ("periodSeconds", 10),
            ("successThreshold", 1),
            ("failureThreshold", 3),
        ] {
            let value = probe.entry(key).or_insert(json!(0));
            if *value == 0 {
                *value = json!(default);
            }
        }
        let get = probe["httpGet"].as_object_mut().unwrap();
        for (key, default) in [("path", "/"), ("scheme", "HTTP")] {
            let value = get.entry(key).or_insert(json!(""));
            if *value == "" {
                *value = json!(default);
            }
        }
    }
    if let Some(Value::Array(mounts)) = fields.get_mut("volumeMounts") {
        for mount in mounts {
            if mount["readOnly"] == false {
                mount.as_object_mut().unwrap().remove("readOnly");
            }
        }
    }
    stored
}

/// The canonical form the API server writes the quantities these cases use in.
fn canonical(quantity: &str) -> &str {
    match quantity {
        "0.5" => "500m",
        "1024Mi" => "1Gi",
        other => other,
    }
}

/// The Pod's container: `stored` with what the API server and admission plugins add, and
/// `change`.
fn in_pod(stored: &Value, added: Added, change: Change) -> Value {
    let mut container = stored.clone();
    let fields = container.as_object_mut().unwrap();
    if added.token_mount {
        push(fields, "volumeMounts", token_mount(TOKEN_VOLUME));
    }
    if added.limit_range {
        // The LimitRanger fills in each default the container does not set.
        let resources = fields["resources"].as_object_mut().unwrap();
        for (kind, name, quantity) in [
            ("limits", "memory", "128Mi"),
            ("requests", "memory", "128Mi"),
            ("limits", "cpu", "2"),
        ] {
            resources
                .entry(kind)
                .or_insert(json!({}))
                .as_object_mut()
                .unwrap()
                .entry(name)
                .or_insert(json!(quantity));
        }
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
                .entry("hostPort")
                .or_insert(container_port);
        }
    }
    changed(fields, stored, change);
    container
}

/// `fields` with the look-alike's `change`.
fn changed(fields: &mut Map<String, Value>, stored: &Value, change: Change) {
    match change {
        Change::None => {}
        Change::Image => {
            fields.insert("image".into(), json!("agents.invalid/other:1.2"));
        }
        Change::ExtraEnv => push(fields, "env", json!({"name": "INJECTED_BY", "value": "x"})),
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
        Change::ExtraArg => push(fields, "args", json!("--debug")),
        Change::PortNumber => {
            fields.insert(
                "ports".into(),
                json!([{"containerPort": 7000, "name": "metrics", "protocol": "TCP"}]),
            );
        }
        Change::ExtraPort => push(
            fields,
            "ports",
            json!({"containerPort": 7001, "protocol": "TCP"}),
        ),
        Change::MountPath => {
            fields.insert(
                "volumeMounts".into(),
                json!([{"name": "data", "mountPath": "/elsewhere"}]),
            );
        }
        Change::ExtraMount => push(
            fields,
            "volumeMounts",
            json!({"name": "host", "mountPath": "/host"}),
        ),
        Change::PullPolicy => {
            // Neither the stored policy nor the `Always` a plugin may set.
            let other = if stored["imagePullPolicy"] == "Never" {
                "IfNotPresent"
            } else {
                "Never"
            };
            fields.insert("imagePullPolicy".into(), json!(other));
        }
        Change::RequestsCpu => {
            let resources = fields["resources"].as_object_mut().unwrap();
            let requests = resources.entry("requests").or_insert(json!({}));
            requests["cpu"] = json!("250m");
        }
        Change::ProbePeriod => {
            let probe = fields
                .entry("readinessProbe")
                .or_insert(json!({"tcpSocket": {"port": 9100}}));
            probe["periodSeconds"] = json!(3600);
        }
        Change::SecurityContext => {
            fields.insert("securityContext".into(), json!({"privileged": true}));
        }
        Change::TerminationMessagePath => {
            fields.insert("terminationMessagePath".into(), json!("/tmp/x"));
        }
        Change::RestartPolicy => {
            if fields.remove("restartPolicy").is_none() {
                fields.insert("restartPolicy".into(), json!("Always"));
            }
        }
        Change::FakeTokenMount => push(fields, "volumeMounts", token_mount(FAKE_TOKEN_VOLUME)),
        Change::WritableTokenMount => {
            // `readOnly: false` written out, where the API server leaves it out: the
            // interpreter fails `m.?readOnly` on a map without the key (see `cel_present`).
            let mut mount = token_mount(TOKEN_VOLUME);
            mount["readOnly"] = json!(false);
            push(fields, "volumeMounts", mount);
        }
        Change::TokenSubPath => {
            let mut mount = token_mount(TOKEN_VOLUME);
            mount["subPath"] = json!("token");
            push(fields, "volumeMounts", mount);
        }
    }
}

/// The mount the ServiceAccount plugin adds, of `volume`.
fn token_mount(volume: &str) -> Value {
    json!({"name": volume, "readOnly": true, "mountPath": SERVICE_ACCOUNT_MOUNT_PATH})
}

/// `item` appended to the list `key` of `fields`, which is created if missing.
fn push(fields: &mut Map<String, Value>, key: &str, item: Value) {
    fields
        .entry(key)
        .or_insert(json!([]))
        .as_array_mut()
        .unwrap()
        .push(item);
}

/// Whether both forms should find the template's container: unchanged but for what the API
/// server may add, and, for a native sidecar, in place.
fn expected(ours: &Ours, change: Change, before: &[Init]) -> bool {
    let unchanged = match change {
        Change::None => true,
        // Where the template sets no CPU request, any may stand: a LimitRange's.
        Change::RequestsCpu => ours.requests_cpu.is_none(),
        _ => false,
    };
    let in_place = !ours.native_sidecar || before.iter().all(|i| i.native_sidecar || i.templates);
    unchanged && in_place
}

/// The Pod: an app container, the init containers `before` and, in `containers` or
/// `initContainers` as the template places it, `container`. Every map the CEL reads through
/// `?` has its key (see `cel_present`).
fn pod(container: &Value, native_sidecar: bool, before: &[Init], host_network: bool) -> Value {
    let mut init_containers: Vec<Value> = before
        .iter()
        .enumerate()
        .map(|(index, init)| {
            let policy = if init.native_sidecar { "Always" } else { "" };
            json!({"name": init_name(index, *init), "image": "init.invalid/init:1", "restartPolicy": policy})
        })
        .collect();
    let mut containers = vec![json!({"name": "app", "image": "app.invalid/app:1"})];
    if native_sidecar {
        init_containers.push(container.clone());
    } else {
        containers.push(container.clone());
    }
    json!({
        "metadata": {"name": "web-1", "labels": {}, "annotations": {}},
        "spec": {
            "hostNetwork": host_network,
            "initContainers": init_containers,
            "containers": containers,
            "volumes": [
                {"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
                {"name": FAKE_TOKEN_VOLUME, "projected": {"sources": [{"configMap": {"name": "token"}}]}},
            ],
        },
    })
}

fn init_name(index: usize, init: Init) -> String {
    let owner = if init.templates { "tmpl" } else { "own" };
    format!("{owner}-{index}")
}

/// Placeholders as the policy renders them; these cases hold none.
fn text(template: &TemplateString) -> String {
    panic!("no placeholder expected: {template:?}")
}

/// The CEL form's verdict on `pod`, every template's init container named in `template_init`.
/// The interpreter (`cel` 0.13 under `kube-cel` 0.8) fails `x.?field` on a map without the
/// key, where CEL gives `optional.none()`: the Pod has every map the condition reads that way
/// (`restartPolicy: ""` on a plain init container, `orValue("")` reading both the same).
fn cel_present(list: &str, body: &Node, stored: &Value, template_init: &str, pod: &Value) -> bool {
    let source = container_presence(list, body, stored, template_init, &text)
        .unwrap_or_else(|| panic!("no condition for {stored}"));
    evaluate_bool(&source, pod)
}

/// `plan`'s verdict: the container is the template's, and a native sidecar stands in place.
fn rust_present(
    template: &Value,
    container: &Value,
    native_sidecar: bool,
    before: &[Init],
    host_network: bool,
) -> Result<(), String> {
    let surroundings = Surroundings {
        host_network,
        token_volumes: &[TOKEN_VOLUME],
    };
    if let Some(field) = difference(template, container, ItemKind::Container, &surroundings) {
        return Err(format!("{field} differs"));
    }
    let before = before.iter().map(|init| Before {
        native_sidecar: init.native_sidecar,
        templates: init.templates,
    });
    match first_blocking(before) {
        Some(blocking) if native_sidecar => Err(format!("after init container {blocking}")),
        _ => Ok(()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_rust_and_cel_forms_of_presence_agree(
        ours in ours(),
        added in added(),
        change in change(),
        before in before(),
    ) {
        let before = if ours.native_sidecar { before } else { Vec::new() };
        let template = template_container(&ours);
        let stored = stored(&template);
        let container = in_pod(&stored, added, change);
        let pod = pod(&container, ours.native_sidecar, &before, added.host_network);
        let rust = rust_present(&template, &container, ours.native_sidecar, &before, added.host_network);
        let list = if ours.native_sidecar { "initContainers" } else { "containers" };
        let template_init: Vec<String> = before
            .iter()
            .enumerate()
            .filter(|(_, init)| init.templates)
            .map(|(index, init)| init_name(index, *init))
            .chain(ours.native_sidecar.then(|| "agent".to_owned()))
            .collect();
        let template_init = cel_list(template_init.iter().map(String::as_str));
        let body = Node::parse(&template, "container", &mut Vec::new());
        let cel = cel_present(list, &body, &stored, &template_init, &pod);
        prop_assert_eq!(rust.is_ok(), cel, "Rust says {:?}; the Pod: {}", rust, pod);
        // Neither form takes a look-alike for the template's, nor refuses what the API server
        // and its plugins made of it.
        prop_assert_eq!(cel, expected(&ours, change, &before), "the Pod: {}", pod);
    }

    /// The template's side, [`holds_cel`], leans to "holds" (it looks only at what the
    /// template sets) but never refuses a container `difference` finds the template's: that
    /// would leave the Pod to the guard, which would refuse it where the webhook admits it.
    #[test]
    fn holds_cel_holds_wherever_difference_finds_none(
        ours in ours(),
        added in added(),
        change in change(),
    ) {
        let ours = Ours { native_sidecar: false, ..ours };
        let template = template_container(&ours);
        let container = in_pod(&stored(&template), added, change);
        let pod = pod(&container, false, &[], added.host_network);
        let rust = rust_present(&template, &container, false, &[], added.host_network);
        let holds = holds(&template, &text, &container, &pod);
        prop_assert!(rust.is_err() || holds, "the Pod: {}", pod);
        if change == Change::Image {
            prop_assert!(!holds, "another image held: {}", pod);
        }
    }
}

/// [`holds_cel`]'s verdict on `container`, an item of `pod`.
fn holds(
    template: &Value,
    text: &dyn Fn(&TemplateString) -> String,
    container: &Value,
    pod: &Value,
) -> bool {
    let body = Node::parse(template, "container", &mut Vec::new());
    let source = holds_cel(&body, "c", ItemKind::Container, text);
    evaluate_bool_over(&source, &[("object", pod), ("c", container)])
}

/// A placeholder that may render empty: the Pod's `team` annotation.
const TEAM: &str = "{{ pod.annotations['team'] }}";

/// Where the template's container holds [`TEAM`].
#[derive(Clone, Copy, Debug)]
struct Placed {
    /// In an env var's `value` (nested, left out by the API server when empty).
    env: bool,
    /// In an argument (never empty).
    arg: bool,
    /// As the whole `workingDir` (top-level, left out when empty).
    working_dir: bool,
}

fn placed() -> impl Strategy<Value = Placed> {
    (any::<bool>(), any::<bool>(), any::<bool>())
        .prop_filter("a placeholder somewhere", |(e, a, w)| *e || *a || *w)
        .prop_map(|(env, arg, working_dir)| Placed {
            env,
            arg,
            working_dir,
        })
}

/// The template's container with [`TEAM`] where `placed` says.
fn templated_container(placed: Placed) -> Value {
    let mut container = json!({"name": "agent", "image": "agents.invalid/agent:1.2"});
    if placed.env {
        container["env"] =
            json!([{"name": "TEAM", "value": TEAM}, {"name": "MODE", "value": "mass"}]);
    }
    if placed.arg {
        container["args"] = json!(["--verbose", format!("--team={TEAM}")]);
    }
    if placed.working_dir {
        container["workingDir"] = json!(TEAM);
    }
    container
}

/// `template` rendered for a Pod whose `team` annotation is `team`.
fn rendered(template: &Value, team: &str) -> Value {
    serde_json::from_str(&template.to_string().replace(TEAM, team)).unwrap()
}

/// Placeholders as the policy renders them (`policy::cel_text`), for [`TEAM`].
fn team_text(template: &TemplateString) -> String {
    let parts: Vec<String> = template
        .parts()
        .map(|part| match part {
            Part::Literal(text) => Value::from(text).to_string(),
            Part::Annotation(key) => format!(
                "object.metadata.annotations[?{}].orValue(\"\")",
                Value::from(key)
            ),
            other => panic!("not expected here: {other:?}"),
        })
        .collect();
    format!("({})", parts.join(" + "))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The proof rendered the placeholders for its own Pod, and the Pod under admission has
    /// the container rendered for itself (as the policy or the webhook injected it), or, a
    /// look-alike, for another `team`.
    #[test]
    fn the_forms_agree_where_placeholders_render_per_pod(
        placed in placed(),
        proof_team in prop::sample::select(vec!["", "a"]),
        pod_team in prop::sample::select(vec!["", "a", "b"]),
        rendered_for in prop::option::of(prop::sample::select(vec!["", "b", "zz"])),
        added in added(),
    ) {
        let template = templated_container(placed);
        let stored = stored(&rendered(&template, proof_team));
        // `None`: rendered for this Pod; a look-alike otherwise, unless that renders the same.
        let look_alike = rendered_for.filter(|team| *team != pod_team);
        let container = in_pod(
            &stored_for_pod(&template, look_alike.unwrap_or(pod_team)),
            Added { host_network: false, ..added },
            Change::None,
        );
        let mut pod = pod(&container, false, &[], false);
        // Every map read through `[?key]` has the key (see `cel_present`).
        pod["metadata"]["annotations"] = json!({"team": pod_team});
        let rust = rust_present(&rendered(&template, pod_team), &container, false, &[], false);
        let body = Node::parse(&template, "container", &mut Vec::new());
        let source = container_presence("containers", &body, &stored, "[]", &team_text)
            .unwrap_or_else(|| panic!("no condition for {stored}"));
        let cel = evaluate_bool(&source, &pod);
        prop_assert_eq!(rust.is_ok(), cel, "Rust says {:?}; the Pod: {}", rust, pod);
        prop_assert_eq!(cel, look_alike.is_none(), "the Pod: {}", pod);
        let holds = holds(&template, &team_text, &container, &pod);
        prop_assert!(rust.is_err() || holds, "holds_cel refuses: {}", pod);
    }
}

/// The container as the API server stores it for a Pod whose `team` annotation is `team`.
fn stored_for_pod(template: &Value, team: &str) -> Value {
    stored(&rendered(template, team))
}

/// `source`, a CEL condition, evaluated over the Pod `object`.
fn evaluate_bool(source: &str, object: &Value) -> bool {
    evaluate_bool_over(source, &[("object", object)])
}

/// `source`, a CEL condition, evaluated over `variables`.
fn evaluate_bool_over(source: &str, variables: &[(&str, &Value)]) -> bool {
    match evaluate(source, variables) {
        cel::Value::Bool(verdict) => verdict,
        other => panic!("{source}: {other:?}"),
    }
}
