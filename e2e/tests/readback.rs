//! The YAML the binary prints, read back by kubectl itself: `sidecar-injector render` of a Pod
//! and a Deployment full of strings that YAML 1.1 takes for something else (`yes`, `on`, `~`,
//! `0755`, `1:30`, `.inf`, dates, `<<`, …), and `sidecar-injector crd`. kubectl decodes each
//! file client-side (`kubectl annotate --local -o json`, the same decoding as `kubectl create
//! -f`: sigs.k8s.io/yaml over go-yaml) and must get back exactly what was meant: the rendered
//! Pod equals its input with `render -o patch` applied, every value of the Deployment is the
//! string it was, and the CRD equals `injector_api::crd()`.
//!
//! Needs no control plane, only the cached kubectl (`e2e/control-plane/build.sh kubectl`); off
//! unless `SIDECAR_INJECTOR_E2E=1` (`just e2e`), like the other tests here.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use injector_e2e::harness;
use injector_e2e::{operator_binary, tool};
use serde_json::{Map, Value, json};

/// Strings a YAML 1.1 reader resolves to a boolean, null, number, timestamp, merge key or
/// value key when written bare, or that lose their spaces or line breaks when written plain.
const TRICKY: &[&str] = &[
    "yes",
    "Yes",
    "YES",
    "no",
    "No",
    "NO",
    "y",
    "Y",
    "n",
    "N",
    "on",
    "On",
    "ON",
    "off",
    "Off",
    "OFF",
    "true",
    "True",
    "TRUE",
    "false",
    "False",
    "FALSE",
    "yEs",
    "oN",
    "~",
    "null",
    "Null",
    "NULL",
    "",
    "0",
    "0755",
    "0o17",
    "0x1F",
    "0b101",
    "1_000",
    "1:30",
    "190:20:30",
    "1.5",
    "1e3",
    "-1",
    "+1",
    "-.5",
    ".inf",
    "-.Inf",
    ".NaN",
    "2024-01-01",
    "2001-12-14t21:59:43.10-05:00",
    "2001-12-14 21:59:43.10 -5",
    "=",
    "<<",
    " leading",
    "trailing ",
    "- dash",
    "? what",
    ": colon",
    "key: value",
    "# hash",
    "a #b",
    "@at",
    "`tick",
    "!tag",
    "&anchor",
    "*alias",
    "%percent",
    "|",
    ">",
    "[list]",
    "{map}",
    "'single'",
    "\"double\"",
    "two\nlines",
    "  indented\nnext",
    "ends with a newline\n",
    "ends with two\n\n",
    "tab\there",
    "---",
    "...",
    "a string long enough that a writer might fold it over several lines, which a reader must \
     join again exactly as it was written",
];

/// The subset that is a valid label value, for labels and selectors.
const TRICKY_LABEL_VALUES: &[&str] = &[
    "yes",
    "Yes",
    "YES",
    "no",
    "No",
    "NO",
    "y",
    "Y",
    "n",
    "N",
    "on",
    "On",
    "ON",
    "off",
    "Off",
    "OFF",
    "true",
    "True",
    "TRUE",
    "false",
    "False",
    "FALSE",
    "null",
    "Null",
    "NULL",
    "",
    "0",
    "0755",
    "0o17",
    "0x1F",
    "0b101",
    "1_000",
    "1.5",
    "1e3",
    "2024-01-01",
];

/// Map keys that YAML 1.1 resolves to something else (valid label and annotation keys and env
/// names all).
const TRICKY_KEYS: &[&str] = &[
    "yes",
    "no",
    "y",
    "n",
    "on",
    "off",
    "true",
    "false",
    "null",
    "Y",
    "N",
    "ON",
    "NO",
    "0755",
    "0x1F",
    "1_000",
    "1.5",
    "2024-01-01",
];

/// The annotation kubectl is asked to add (it will not decode a file without changing it).
const MARK: &str = "readback.sidecar.dev/checked";

fn main() -> ExitCode {
    harness::run_tests(
        "readback",
        &[(
            "kubectl_reads_back_what_the_binary_prints",
            kubectl_reads_back_what_the_binary_prints,
        )],
    )
}

fn kubectl_reads_back_what_the_binary_prints() {
    let kubectl = tool("kubectl").expect("kubectl is built");
    let binary = operator_binary().expect("the binary builds");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("readback");
    std::fs::create_dir_all(&dir).unwrap();

    // The Pod: input plus its patch is what the YAML must say.
    let template = write_json(&dir.join("template.json"), &template());
    let input = pod();
    let pod_file = write_json(&dir.join("pod.json"), &input);
    let yaml = run(&binary, &render_args(&template, &pod_file, "pod"));
    let patch: json_patch::Patch =
        serde_json::from_str(&run(&binary, &render_args(&template, &pod_file, "patch")))
            .expect("render -o patch prints a JSON patch");
    let mut expected = input;
    json_patch::patch(&mut expected, &patch).unwrap();
    assert_ne!(expected, pod(), "the template applies");
    let read = kubectl_read(&kubectl, &dir.join("pod.yaml"), &yaml);
    assert_eq!(read.len(), 1);
    assert_same(&read[0], &expected, "the rendered Pod");

    // A Deployment beside a Pod (two documents): every leaf is a string, as it was written.
    let both = write_json(
        &dir.join("both.json"),
        &Value::Array(vec![deployment(), pod()]),
    );
    let yaml = run(&binary, &render_args(&template, &both, "pod"));
    let read = kubectl_read(&kubectl, &dir.join("both.yaml"), &yaml);
    assert_eq!(read.len(), 2, "{yaml}");
    for object in &read {
        assert_only_strings(object, "");
    }
    let env = read[0]
        .pointer("/spec/template/spec/containers/0/env")
        .and_then(Value::as_array)
        .expect("the app keeps its env");
    for (i, value) in TRICKY.iter().enumerate() {
        assert!(
            env.iter()
                .any(|e| e["name"] == format!("E{i}") && e["value"] == *value),
            "env E{i} = {value:?} read back as something else: {env:?}"
        );
    }

    // The CRD, as `crds/` holds it.
    let yaml = run(&binary, &["crd".to_owned()]);
    let read = kubectl_read(&kubectl, &dir.join("crd.yaml"), &yaml);
    let crd = serde_json::to_value(injector_api::crd()).unwrap();
    assert_same(&read[0], &crd, "the CRD");
}

fn template() -> Value {
    let annotations: Map<String, Value> = TRICKY
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("tpl.sidecar.dev/a{i}"), json!(v)))
        .collect();
    let labels: Map<String, Value> = TRICKY_LABEL_VALUES
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("tpl.sidecar.dev/l{i}"), json!(v)))
        .collect();
    json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": "tricky"},
        "spec": {
            "metadata": {"annotations": annotations, "labels": labels},
            "containers": [{
                "name": "tricky",
                "image": "busybox:1.36",
                "command": TRICKY,
                "args": TRICKY,
                "env": env("T", TRICKY),
            }],
            "appContainers": {"env": env("A", TRICKY)},
        },
    })
}

fn pod() -> Value {
    let mut annotations: Map<String, Value> = TRICKY
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("a{i}"), json!(v)))
        .collect();
    let mut labels: Map<String, Value> = TRICKY_LABEL_VALUES
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("l{i}"), json!(v)))
        .collect();
    for key in TRICKY_KEYS {
        annotations.insert((*key).to_owned(), json!(key));
        labels.insert((*key).to_owned(), json!(key));
    }
    let mut env = env("E", TRICKY);
    env.extend(TRICKY_KEYS.iter().map(|k| json!({"name": k, "value": k})));
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "tricky", "namespace": "yes", "annotations": annotations, "labels": labels},
        "spec": {"containers": [{
            "name": "app",
            "image": "busybox:1.36",
            "command": TRICKY,
            "args": TRICKY,
            "env": env,
        }]},
    })
}

fn deployment() -> Value {
    let pod = pod();
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "on", "namespace": "off", "labels": pod["metadata"]["labels"]},
        "spec": {
            "selector": {"matchLabels": pod["metadata"]["labels"]},
            "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
        },
    })
}

fn env(prefix: &str, values: &[&str]) -> Vec<Value> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| json!({"name": format!("{prefix}{i}"), "value": v}))
        .collect()
}

fn render_args(template: &Path, pod: &Path, output: &str) -> Vec<String> {
    [
        "render",
        "--template",
        path(template),
        "--pod",
        path(pod),
        "-o",
        output,
    ]
    .map(str::to_owned)
    .to_vec()
}

fn write_json(file: &Path, value: &Value) -> PathBuf {
    std::fs::write(file, serde_json::to_string_pretty(value).unwrap()).unwrap();
    file.to_path_buf()
}

/// Runs the binary; its standard output.
fn run(binary: &Path, args: &[String]) -> String {
    let output = Command::new(binary).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "sidecar-injector {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Writes `yaml` to `file` and has kubectl decode it without a server; the objects it read,
/// without the annotation it was asked to add.
fn kubectl_read(kubectl: &Path, file: &Path, yaml: &str) -> Vec<Value> {
    std::fs::write(file, yaml).unwrap();
    let output = Command::new(kubectl)
        .args(["annotate", "--local", "-o", "json", "-f", path(file)])
        .arg(format!("{MARK}=x"))
        // No kubeconfig is needed, and none of the user's may be read.
        .env("KUBECONFIG", "/dev/null")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "kubectl cannot read back {}: {}\n{yaml}",
        file.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    // One JSON object per object read, one after the other.
    let mut objects: Vec<Value> = serde_json::Deserializer::from_slice(&output.stdout)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    for object in &mut objects {
        let metadata = object["metadata"].as_object_mut().unwrap();
        let annotations = metadata["annotations"].as_object_mut().unwrap();
        assert_eq!(annotations.remove(MARK), Some(json!("x")));
        if annotations.is_empty() {
            metadata.remove("annotations");
        }
    }
    objects
}

/// `read` equals `expected`; on a difference, the first path where they part.
fn assert_same(read: &Value, expected: &Value, what: &str) {
    if let Some(difference) = first_difference(read, expected, String::new()) {
        panic!("{what}: kubectl read something else at {difference}");
    }
}

fn first_difference(read: &Value, expected: &Value, at: String) -> Option<String> {
    match (read, expected) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter().find_map(|key| {
                let here = format!("{at}/{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => first_difference(x, y, here),
                    (x, y) => Some(format!("{here}: read {x:?}, written {y:?}")),
                }
            })
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, format!("{at}/{i}"))),
        (a, b) if a == b => None,
        // 1000000 and 1000000.0 are the same JSON number.
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => None,
        (a, b) => Some(format!("{at}: read {a}, written {b}")),
    }
}

/// Every scalar in `value` is a string (the fixtures hold no other kind).
fn assert_only_strings(value: &Value, at: &str) {
    match value {
        Value::String(_) => {}
        Value::Object(map) => {
            for (key, value) in map {
                assert_only_strings(value, &format!("{at}/{key}"));
            }
        }
        Value::Array(items) => {
            for (i, value) in items.iter().enumerate() {
                assert_only_strings(value, &format!("{at}/{i}"));
            }
        }
        other => panic!("kubectl read {other} at {at}, where a string was written"),
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}
