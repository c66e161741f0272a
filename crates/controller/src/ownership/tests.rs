use super::*;

fn owner(uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: "ClusterRole".into(),
        name: "sidecar-injector".into(),
        uid: uid.into(),
        ..OwnerReference::default()
    }
}

#[test]
fn an_owner_is_added_once_and_others_are_kept() {
    let mut metadata = ObjectMeta {
        owner_references: Some(vec![owner("someone-else")]),
        ..ObjectMeta::default()
    };
    assert!(add_owner(&mut metadata, &owner("ours")));
    assert!(!add_owner(&mut metadata, &owner("ours")));
    assert_eq!(
        metadata.owner_references,
        Some(vec![owner("someone-else"), owner("ours")])
    );
}
