use super::*;

#[test]
fn a_request_keeps_the_snapshot_it_started_with() {
    let templates = Templates::new();
    let first = Arc::new(Snapshot::default());
    templates.publish(Arc::clone(&first));
    let held = templates.current();
    let second = Arc::new(Snapshot::default());
    templates.publish(Arc::clone(&second));
    assert!(Arc::ptr_eq(&held, &first), "a loan made before publishing");
    assert!(
        Arc::ptr_eq(&templates.current(), &second),
        "a loan made after"
    );
    drop(held);
    assert!(Arc::ptr_eq(&templates.snapshot(), &second));
}
