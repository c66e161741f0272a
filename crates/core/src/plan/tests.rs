use super::*;

#[test]
fn a_record_entry_takes_no_format_flags() {
    let applied = Applied {
        name: "proxy".into(),
        generation: 3,
        fingerprint: Fingerprint::of(&Default::default()),
    };
    let entry = applied.to_string();
    assert!(
        entry.starts_with("proxy@3#") && entry.len() == 24,
        "{entry}"
    );
    for flagged in [
        format!("{applied:>40}"),
        format!("{applied:+}"),
        format!("{applied:04}"),
    ] {
        assert_eq!(flagged, entry);
    }
}

#[test]
fn paths_escape_slash_and_tilde_per_rfc_6901() {
    let path = PatchPath::escaped_then("/metadata/annotations", "a~b/c");
    assert_eq!(path.as_str(), "/metadata/annotations/a~0b~1c");
    let path = PatchPath::escaped("/spec/containers").then_index(12);
    assert_eq!(path.then_escaped("/-").as_str(), "/spec/containers/12/-");
}
