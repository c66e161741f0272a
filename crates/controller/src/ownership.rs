//! Owner references on what the operator creates at run time (its webhook configuration,
//! certificate Secret and Lease), so that `helm uninstall` leaves none of them behind: the
//! chart passes a ClusterRole it installs (`--owner-cluster-role`), and when helm deletes that
//! ClusterRole the garbage collector deletes every object naming it as owner.
//!
//! A cluster-scoped owner is the one kind that works for all three: a namespaced owner (the
//! Deployment, say) is never resolved for the cluster-scoped configuration.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// Adds `owner` to `metadata`'s owner references unless one with its uid is already there;
/// returns whether it added it. Other owners are kept.
pub fn add_owner(metadata: &mut ObjectMeta, owner: &OwnerReference) -> bool {
    let owners = metadata.owner_references.get_or_insert_with(Vec::new);
    if owners.iter().any(|existing| existing.uid == owner.uid) {
        return false;
    }
    owners.push(owner.clone());
    true
}

#[cfg(test)]
mod tests {
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
}
