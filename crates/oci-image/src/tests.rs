#![allow(clippy::unwrap_used)]
use super::*;

fn read_tar(bytes: &[u8]) -> BTreeMap<String, (tar::EntryType, Vec<u8>)> {
    let mut archive = tar::Archive::new(bytes);
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            let kind = e.header().entry_type();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            (path, (kind, data))
        })
        .collect()
}

#[test]
fn layer_has_parents_and_links() {
    let mut layer = Layer::default();
    layer.file("/usr/local/bin/tool", b"x".to_vec(), 0o755);
    layer.symlink("bin/sh", "busybox");
    let entries = read_tar(&layer.tar().unwrap());
    let paths: Vec<_> = entries.keys().cloned().collect();
    assert_eq!(
        paths,
        [
            "bin/",
            "bin/sh",
            "usr/",
            "usr/local/",
            "usr/local/bin/",
            "usr/local/bin/tool"
        ]
    );
    assert_eq!(entries["bin/sh"].0, tar::EntryType::Symlink);
    assert_eq!(entries["usr/local/bin/tool"].1, b"x");
}

#[test]
fn archive_is_an_oci_layout_and_reproducible() {
    let dir = std::env::temp_dir().join(format!("oci-image-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut layer = Layer::default();
    add_users(&mut layer);
    let image = Image {
        names: vec!["example.invalid/a:1".to_owned()],
        layer,
        config: Config {
            entrypoint: vec!["/a".to_owned()],
            user: Some("65532:65532".to_owned()),
            ..Config::default()
        },
    };
    let first = image.write_archive(&dir.join("a.tar")).unwrap();
    let second = image.write_archive(&dir.join("b.tar")).unwrap();
    assert_eq!(first, second);
    let entries = read_tar(&std::fs::read(dir.join("a.tar")).unwrap());
    let index: Value = serde_json::from_slice(&entries["index.json"].1).unwrap();
    assert_eq!(
        index["manifests"][0]["annotations"]["io.containerd.image.name"],
        "example.invalid/a:1"
    );
    let hex = first.manifest_digest.trim_start_matches("sha256:");
    let manifest: Value =
        serde_json::from_slice(&entries[&format!("blobs/sha256/{hex}")].1).unwrap();
    let config_hex = manifest["config"]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_owned();
    let config: Value =
        serde_json::from_slice(&entries[&format!("blobs/sha256/{config_hex}")].1).unwrap();
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(config["config"]["Entrypoint"], json!(["/a"]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn names_need_a_host() {
    assert!(validate_name("example.invalid/a:1").is_ok());
    assert!(validate_name("localhost/a").is_ok());
    assert!(validate_name("a:1").is_err());
    assert!(validate_name("library/a:1").is_err());
    assert_eq!(tag_of("example.invalid/a:1"), "1");
    assert_eq!(tag_of("localhost:5000/a"), "latest");
}
