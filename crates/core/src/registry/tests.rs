use super::Names;

#[test]
fn names_are_found_by_length_then_by_hash() {
    let long = "x".repeat(70);
    let names: Names = ["POD_NAME", "", "a", long.as_str()]
        .map(String::from)
        .into_iter()
        .collect();
    for name in ["POD_NAME", "", "a", long.as_str()] {
        assert!(names.contains(name), "{name}");
    }
    // Names of the same lengths, and lengths from 63 on, which share one bit.
    for name in [
        "POD_NAMF",
        "b",
        &"x".repeat(63),
        &"y".repeat(70),
        "HOSTNAME",
    ] {
        assert!(!names.contains(name), "{name}");
    }
    assert!(!Names::default().contains(""));
}
