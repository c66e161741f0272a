//! Recorded AdmissionReviews (v1 and v1beta1) answered end to end over TLS: the patch is
//! applied to the request's Pod, the result must be a valid Pod, and is snapshotted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::{Value, json};

fn fixtures() -> Vec<PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(here.join("tests/fixtures"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.push(here.join("../../bench/fixtures/typical-pod-review.json"));
    files.sort();
    files
}

fn bench_templates() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/fixtures/templates");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect()
}

#[tokio::test]
async fn recorded_reviews_are_answered_with_patches_that_apply() {
    let templates = bench_templates();
    let refs: Vec<&str> = templates.iter().map(String::as_str).collect();
    let server = start(&refs).await;
    let mut client = server.client().await;
    for file in fixtures() {
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        let review: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let response = client.review("/mutate", &review).await;
        assert_eq!(response["apiVersion"], review["apiVersion"], "{name}");
        assert_eq!(
            response["response"]["uid"], review["request"]["uid"],
            "{name}"
        );
        assert_eq!(response["response"]["allowed"], true, "{name}: {response}");
        let pod = &review["request"]["object"];
        let mutated = patched(pod, &response);
        let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(mutated.clone())
            .unwrap_or_else(|e| panic!("{name}: not a valid Pod: {e}"));
        let spec = typed.spec.unwrap();
        let names = |list: Option<Vec<k8s_openapi::api::core::v1::Container>>| -> Vec<String> {
            list.unwrap_or_default()
                .into_iter()
                .map(|c| c.name)
                .collect()
        };
        insta::assert_json_snapshot!(
            name.clone(),
            json!({
                "auditAnnotations": response["response"]["auditAnnotations"],
                "warnings": response["response"]["warnings"],
                "initContainers": names(spec.init_containers),
                "containers": names(Some(spec.containers)),
                "mutated": mutated,
            })
        );

        // The mutated Pod comes back (a re-invocation): nothing more to add.
        let mut again = review.clone();
        again["request"]["object"] = mutated;
        let response = client.review("/mutate", &again).await;
        assert!(
            response["response"].get("patch").is_none(),
            "{name}: {response}"
        );
    }
}
