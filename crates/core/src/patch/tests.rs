use super::*;
use serde_json::json;

#[test]
fn a_patch_path_is_the_pointer_jsonptr_makes_of_its_tokens() {
    for tokens in [
        vec![],
        vec![""],
        vec!["spec", "containers", "-"],
        vec!["metadata", "annotations", "a/b"],
        vec!["~", "/", "~1", "~0/", "a~b/c~", "é/ü~", "", "x"],
    ] {
        let path = tokens.iter().fold(PatchPath::escaped(""), |path, token| {
            PatchPath::escaped_then(path.as_str(), token)
        });
        let expected = PointerBuf::from_tokens(tokens.iter().copied());
        assert_eq!(path.as_str(), expected.as_str());
        assert_eq!(path.to_pointer(), expected);
    }
}

#[test]
fn serializes_as_rfc_6902_and_converts_to_json_patch() {
    let fixed = Fixed::new(json!({"name": "proxy", "image": "envoy"}));
    let patch = Patch(vec![
        AddOperation {
            path: PatchPath::escaped("/spec/containers/-"),
            value: PatchValue::Fixed(&fixed),
        },
        AddOperation {
            path: PatchPath::escaped_then("/metadata/annotations", "a/b"),
            value: PatchValue::Object(vec![
                ("k", PatchValue::String("v".into())),
                ("n", PatchValue::Array(vec![PatchValue::Owned(json!(1))])),
            ]),
        },
    ]);
    let serialized = serde_json::to_value(&patch).unwrap();
    assert_eq!(
        serialized,
        json!([
            {"op": "add", "path": "/spec/containers/-", "value": {"name": "proxy", "image": "envoy"}},
            {"op": "add", "path": "/metadata/annotations/a~1b", "value": {"k": "v", "n": [1]}},
        ])
    );
    assert_eq!(
        serde_json::to_value(patch.to_json_patch()).unwrap(),
        serialized
    );
    assert_eq!(
        patch.to_json().unwrap(),
        serde_json::to_vec(&patch).unwrap()
    );
}

#[test]
fn base64_matches_the_plain_engine_around_its_thresholds() {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    // Lengths on both sides of where the SIMD engine takes over (128 bytes) and of its
    // 24-byte steps, after text already in the output.
    for len in (0..300).step_by(7).chain(120..=200) {
        for byte in [0u8, 0x3f, 0x80, 0xfb, 0xff] {
            let bytes: Vec<u8> = (0..len)
                .map(|i| byte.wrapping_add((i as u8).wrapping_mul(37)))
                .collect();
            let mut out = b"patch:".to_vec();
            append_base64(&bytes, &mut out);
            assert_eq!(
                out[6..],
                *STANDARD.encode(&bytes).as_bytes(),
                "{len} {byte}"
            );
        }
    }
}

#[test]
fn base64_copies_fixed_parts_at_every_alignment_and_matches_encoding_the_json() {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    let long = Fixed::new(
        json!({"name": "proxy", "image": "registry.example.com/proxy:1.0", "args": ["a"]}),
    );
    let escaped = Fixed::new(json!(["\"quoted\"", "line\nbreak", "tab\t", "\u{1}"]));
    for prefix in 0..7 {
        for text in ["", "x", "\"", "caf\u{e9}"] {
            let mut operations = vec![AddOperation {
                path: PatchPath::escaped_then("/metadata/annotations", &"p".repeat(prefix)),
                value: PatchValue::String(text.repeat(prefix)),
            }];
            // Texts longer than the pending buffer, plain and escaped.
            for long_text in [
                "y".repeat(3 * PENDING_BYTES + prefix),
                "\"".repeat(900 + prefix),
            ] {
                operations.push(AddOperation {
                    path: PatchPath::escaped("/metadata/annotations/long"),
                    value: PatchValue::String(long_text),
                });
            }
            // Enough operations to flush the pending text more than once in between.
            for i in 0..40 {
                operations.push(AddOperation {
                    path: PatchPath::escaped("/spec/containers/-"),
                    value: if i % 3 == 0 {
                        PatchValue::Fixed(&escaped)
                    } else {
                        PatchValue::Array(vec![
                            PatchValue::String("x".repeat(i)),
                            PatchValue::Fixed(&long),
                        ])
                    },
                });
            }
            let patch = Patch(operations);
            let json = patch.to_json().unwrap();
            assert_eq!(json, serde_json::to_vec(&patch).unwrap());
            let mut encoded = b"prefix".to_vec();
            patch.write_base64(&mut encoded).unwrap();
            assert_eq!(
                encoded,
                [b"prefix".as_slice(), STANDARD.encode(&json).as_bytes()].concat()
            );
        }
    }
}

#[test]
fn subset_tolerates_defaulted_fields_only() {
    let ours = json!({"name": "x", "ports": [{"containerPort": 80}]});
    let theirs = json!({"name": "x", "imagePullPolicy": "Always", "ports": [{"containerPort": 80, "protocol": "TCP"}]});
    assert!(is_subset(&ours, &theirs));
    assert!(!is_subset(&theirs, &ours));
    assert!(PatchValue::Fixed(&Fixed::new(ours.clone())).is_subset_of(&theirs));
    let templated = PatchValue::Object(vec![("name", PatchValue::String("x".into()))]);
    assert!(templated.is_subset_of(&theirs));
    let other = json!({"name": "x", "ports": [{"containerPort": 81}]});
    assert!(!is_subset(&ours, &other));
}
