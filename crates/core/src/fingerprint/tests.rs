#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{Value, json};

use super::*;

fn base() -> Value {
    json!({
        "priority": 10,
        "failurePolicy": "Fail",
        "podSelector": {"matchLabels": {"app": "web"}},
        "containers": [{"name": "proxy", "image": "envoy:1.30", "args": ["--pod={{ pod.name }}"]}],
        "initContainers": [{"name": "init", "image": "busybox:1", "restartPolicy": "Always"}],
        "volumes": [{"name": "certs", "emptyDir": {}}],
    })
}

fn fingerprint(spec: &Value) -> Fingerprint {
    Fingerprint::of(&serde_json::from_value(spec.clone()).unwrap())
}

fn edited(pointer: &str, value: Value) -> Value {
    let mut spec = base();
    *spec.pointer_mut(pointer).unwrap() = value;
    spec
}

#[test]
fn only_what_is_injected_counts() {
    let base = fingerprint(&base());
    for unrelated in [
        edited("/priority", json!(20)),
        edited("/failurePolicy", json!("Ignore")),
        edited("/podSelector/matchLabels/app", json!("shop")),
    ] {
        assert_eq!(fingerprint(&unrelated), base, "{unrelated}");
    }
    for injected in [
        edited("/containers/0/args/0", json!("--name={{ pod.name }}")),
        edited("/volumes/0/name", json!("tls")),
        edited("/initContainers/0/restartPolicy", Value::Null),
    ] {
        let changed = fingerprint(&injected);
        assert_ne!(changed, base, "{injected}");
        assert!(!changed.only_images_differ(&base), "{injected}");
    }
}

#[test]
fn an_image_change_is_told_apart_native_sidecars_included() {
    let base = fingerprint(&base());
    for image in [
        edited("/containers/0/image", json!("envoy:1.31")),
        edited("/initContainers/0/image", json!("busybox:2")),
    ] {
        let changed = fingerprint(&image);
        assert_ne!(changed, base);
        assert!(changed.only_images_differ(&base), "{image}");
    }
}

#[test]
fn it_reads_back_what_it_writes() {
    let base = fingerprint(&base());
    let text = base.to_string();
    assert_eq!(text.len(), 16);
    assert_eq!(Fingerprint::parse(&text), Some(base));
    for bad in ["", "123", "zzzzzzzzzzzzzzzz", "0123456789abcdef0"] {
        assert_eq!(Fingerprint::parse(bad), None, "{bad}");
    }
}

#[test]
fn is_written_as_sixteen_hex_digits_of_its_two_halves() {
    for (shape, images) in [
        (0, 0),
        (1, 0xabc),
        (0xdead_beef, 0x0012_3400),
        (u32::MAX, 7),
    ] {
        let fingerprint = Fingerprint { shape, images };
        assert_eq!(fingerprint.to_string(), format!("{shape:08x}{images:08x}"));
    }
}
