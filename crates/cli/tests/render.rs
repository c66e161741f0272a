//! `render` on every example (snapshots), and its answers to bad input.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use injector_cli::render::{OutputFormat, RenderError, RenderRequest, render};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn request(templates: &[&Path], pod: &Path) -> RenderRequest {
    RenderRequest {
        template_files: templates.iter().map(|p| p.to_path_buf()).collect(),
        pod_file: pod.to_path_buf(),
        explain: true,
        ..RenderRequest::default()
    }
}

/// Writes a scratch file under cargo's per-target temporary directory (inside `target/`, so
/// nothing is left behind in the system's temporary directory).
fn scratch(name: &str, content: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("render");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path
}

#[test]
fn every_example_renders_as_snapshotted() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(examples())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 5, "examples are missing: {dirs:?}");
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let template = dir.join("sidecartemplate.yaml");
        let workload = dir.join("workload.yaml");
        let pod =
            render(&request(&[&template], &workload)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(pod.denied, None, "{name}");
        insta::assert_snapshot!(
            name.clone(),
            format!("# stderr\n{}# stdout\n{}", pod.stderr, pod.stdout)
        );
        let patch = render(&RenderRequest {
            output: OutputFormat::Patch,
            ..request(&[&template], &workload)
        })
        .unwrap();
        insta::assert_snapshot!(format!("{name}-patch"), patch.stdout);
    }
}

#[test]
fn every_example_template_is_applied_to_its_workload() {
    for dir in std::fs::read_dir(examples())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
    {
        let rendered = render(&request(
            &[&dir.join("sidecartemplate.yaml")],
            &dir.join("workload.yaml"),
        ))
        .unwrap();
        assert!(
            rendered.stderr.contains("  applied  "),
            "{}: {}",
            dir.display(),
            rendered.stderr
        );
        assert!(
            !rendered.stderr.contains("Warning"),
            "{}: {}",
            dir.display(),
            rendered.stderr
        );
    }
}

#[test]
fn a_required_template_that_cannot_apply_is_reported_as_denied() {
    let template = scratch(
        "required.yaml",
        "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata: {name: agent}\nspec:\n  containers: [{name: app, image: agent}]\n",
    );
    let pod = scratch(
        "pod.json",
        r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "app", "image": "nginx"}]}}"#,
    );
    let rendered = render(&request(&[&template], &pod)).unwrap();
    let denied = rendered.denied.unwrap();
    assert!(
        denied.contains(
            "required SidecarTemplate \"agent\" cannot be applied: container \"app\" already exists"
        ),
        "{denied}"
    );
    assert!(rendered.stderr.contains("DENIED"));
}

#[test]
fn namespace_labels_decide_namespace_selectors() {
    let dir = examples().join("security-agent");
    let pod = scratch(
        "plain-pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: other}\nspec:\n  containers: [{name: app, image: nginx}]\n",
    );
    let mut req = request(&[&dir.join("sidecartemplate.yaml")], &pod);
    let skipped = render(&req).unwrap();
    assert!(
        skipped.stderr.contains("skipped  security-agent"),
        "{}",
        skipped.stderr
    );
    req.namespace_labels
        .insert("security".into(), "enforced".into());
    let applied = render(&req).unwrap();
    assert!(
        applied.stderr.contains("applied  security-agent"),
        "{}",
        applied.stderr
    );
}

fn error(templates: &[&Path], pod: &Path) -> String {
    let error: RenderError = render(&request(templates, pod)).unwrap_err();
    error.to_string()
}

#[test]
fn bad_input_gets_an_error_naming_the_file_and_the_problem() {
    let template = examples().join("log-shipper/sidecartemplate.yaml");
    let pod = examples().join("log-shipper/workload.yaml");
    let missing = Path::new("/nonexistent/pod.yaml");
    assert!(error(&[&template], missing).starts_with("/nonexistent/pod.yaml: cannot read:"));

    let bad_yaml = scratch("bad.yaml", "kind: Pod\nmetadata: {name: [unclosed\n");
    let message = error(&[&template], &bad_yaml);
    assert!(message.contains("bad.yaml: invalid YAML"), "{message}");

    let bad_json = scratch("bad.json", "{\"kind\": \"Pod\",");
    let message = error(&[&template], &bad_json);
    assert!(message.contains("bad.json: invalid JSON"), "{message}");

    let scalar = scratch("scalar.yaml", "just a string\n");
    let message = error(&[&template], &scalar);
    assert!(
        message.contains("scalar.yaml: document 1 is not a Kubernetes object"),
        "{message}"
    );

    let config_map = scratch(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
    );
    let message = error(&[&template], &config_map);
    assert!(
        message.contains("cm.yaml: no Pod or workload found")
            && message.contains("(found ConfigMap/c)"),
        "{message}"
    );
    let message = error(&[&config_map], &pod);
    assert!(
        message.contains("cm.yaml: no SidecarTemplate found (found ConfigMap/c)"),
        "{message}"
    );

    let invalid = scratch(
        "invalid.yaml",
        "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata: {name: x}\nspec:\n  containers: [{name: Bad, image: x}, {name: other}]\n",
    );
    let message = error(&[&invalid], &pod);
    assert!(
        message.contains("invalid.yaml: template \"x\" is invalid: spec.containers[0].name"),
        "{message}"
    );
    assert!(
        message.contains("spec.containers[1].image: is required"),
        "{message}"
    );

    // Read as kubectl reads it (YAML 1.1): a bare `y` is a boolean, not a name.
    let yaml11 = scratch(
        "yaml11.yaml",
        "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata: {name: x}\nspec:\n  containers: [{name: y, image: x}]\n",
    );
    let message = error(&[&yaml11], &pod);
    assert!(
        message.contains(
            "yaml11.yaml: document 1: not a valid SidecarTemplate: invalid type: boolean"
        ),
        "{message}"
    );

    let shape = scratch(
        "shape.yaml",
        "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata: {name: x}\nspec: {priority: high}\n",
    );
    let message = error(&[&shape], &pod);
    assert!(
        message.contains("shape.yaml: document 1: not a valid SidecarTemplate"),
        "{message}"
    );

    let no_template = scratch(
        "deploy.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {}\n",
    );
    let message = error(&[&template], &no_template);
    assert!(
        message.contains("deploy.yaml: Deployment/d: has no pod template at /spec/template"),
        "{message}"
    );

    let no_containers = scratch(
        "nocontainers.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {}\n",
    );
    let message = error(&[&template], &no_containers);
    assert!(
        message.contains("nocontainers.yaml: Pod/p: not a valid Pod: spec.containers is missing"),
        "{message}"
    );
}

#[test]
fn json_lists_and_multi_document_files_are_read() {
    let template = examples().join("native-proxy/sidecartemplate.yaml");
    let list = scratch(
        "list.json",
        r#"{"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "annotations": {"sidecar.dev/templates": "native-proxy"}}, "spec": {"containers": [{"name": "a", "image": "a"}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "b"}, "spec": {"containers": [{"name": "b", "image": "b"}]}}]}"#,
    );
    let rendered = render(&request(&[&template], &list)).unwrap();
    assert_eq!(rendered.stdout.matches("kind: Pod").count(), 2);
    assert!(rendered.stdout.contains("---\n"));
    assert!(
        rendered
            .stderr
            .contains("Pod/a in default:\n  applied  native-proxy"),
        "{}",
        rendered.stderr
    );
}

#[test]
fn the_binary_exits_non_zero_with_a_message_and_never_panics() {
    let binary = env!("CARGO_BIN_EXE_sidecar-injector");
    let template = examples().join("native-proxy/sidecartemplate.yaml");
    let garbage = scratch("garbage.yaml", "\u{0}\u{1}: [\n");
    for args in [
        vec![
            "render".into(),
            "--template".into(),
            template.display().to_string(),
            "--pod".into(),
            garbage.display().to_string(),
        ],
        vec![
            "render".into(),
            "--template".into(),
            "/nonexistent".into(),
            "--pod".into(),
            garbage.display().to_string(),
        ],
        vec![
            "render".into(),
            "--pod".into(),
            garbage.display().to_string(),
        ],
        vec![
            "render".into(),
            "-t".into(),
            template.display().to_string(),
            "-p".into(),
            template.display().to_string(),
            "--namespace-labels".into(),
            "bad label=x".into(),
        ],
    ] {
        let output = Command::new(binary).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}");
        assert_ne!(output.status.code(), Some(101), "panicked: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!stderr.trim().is_empty());
    }

    let denied_template = scratch(
        "deny.yaml",
        "apiVersion: sidecar.dev/v1alpha1\nkind: SidecarTemplate\nmetadata: {name: agent}\nspec:\n  containers: [{name: app, image: agent}]\n",
    );
    let pod = scratch(
        "deny-pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: app, image: nginx}]\n",
    );
    let output = Command::new(binary)
        .args([
            "render",
            "-t",
            &denied_template.display().to_string(),
            "-p",
            &pod.display().to_string(),
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("denied: Pod/p in default: required SidecarTemplate")
    );
}

#[test]
fn a_reader_that_goes_away_is_no_panic() {
    use std::io::Read as _;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
        .arg("crd")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // As `| head -c 16` does: read a little, then close the pipe.
    let mut first = [0; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
}

#[test]
fn the_crd_command_prints_what_crds_and_the_chart_hold() {
    let output = Command::new(env!("CARGO_BIN_EXE_sidecar-injector"))
        .arg("crd")
        .output()
        .unwrap();
    assert!(output.status.success());
    let generated = String::from_utf8(output.stdout).unwrap();
    // crds/ for `kubectl apply`, and the chart's copy its templates/crd.yaml renders.
    for committed in [
        "crds/sidecartemplates.sidecar.dev.yaml",
        "charts/sidecar-injector/files/sidecartemplates.sidecar.dev.yaml",
    ] {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join(committed),
        )
        .unwrap();
        assert_eq!(
            generated, text,
            "{committed} has drifted from the Rust types: run `just generate`"
        );
    }
}

/// One version everywhere: the chart's `version` and `appVersion` are the workspace's
/// (`Cargo.toml`), which the binary, the image's labels and `just dist`'s artifacts carry.
#[test]
fn the_chart_has_the_workspace_version() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/sidecar-injector/Chart.yaml");
    let chart: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for key in ["version", "appVersion"] {
        assert_eq!(
            chart[key],
            env!("CARGO_PKG_VERSION"),
            "Chart.yaml's {key} is not Cargo.toml's workspace version: change them together"
        );
    }
}
