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
mod tests;
