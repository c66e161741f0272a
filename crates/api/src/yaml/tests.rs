#![allow(clippy::unwrap_used)]
use std::collections::BTreeMap;

/// A few of what `e2e/tests/readback.rs` has kubectl itself read back, here read back
/// with YAML 1.1 booleans and octal, and checked to be quoted.
#[test]
fn strings_a_yaml_1_1_reader_would_resolve_are_quoted() {
    let options = || {
        serde_saphyr::options! { strict_booleans: false, legacy_octal_numbers: true }
    };
    for text in [
        "yes",
        "No",
        "ON",
        "y",
        "n",
        "~",
        "null",
        "0755",
        "0x1F",
        "1_000",
        "1:30",
        ".inf",
        "2024-01-01",
        "=",
        "<<",
        " padded ",
        "two\nlines",
    ] {
        let map = BTreeMap::from([(text, text)]);
        let yaml = super::to_string(&map).unwrap();
        assert!(yaml.starts_with(['"', '\'']), "{text:?} as a key: {yaml}");
        assert!(
            yaml.contains(": \"") || yaml.contains(": |"),
            "{text:?} as a value: {yaml}"
        );
        let read: BTreeMap<String, serde_json::Value> =
            serde_saphyr::from_str_with_options(&yaml, options()).unwrap();
        assert_eq!(read, BTreeMap::from([(text.to_owned(), text.into())]));
    }
}
