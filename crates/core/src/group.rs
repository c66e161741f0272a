//! Selector groups: templates that share (namespaceSelector, podSelector, failurePolicy) are
//! served by one webhook entry, at `/mutate/<id>` (docs/architecture.md, decision 2). Past
//! [`MAX_GROUPS`] groups, those that differ only in their pod selector are merged
//! ([`merge_past_bound`], decision 19).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use injector_api::FailurePolicy;
use sha2::{Digest, Sha256};

use crate::selector::Selector;
use crate::template::CompiledTemplate;

/// What templates of one webhook entry share.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    /// Becomes the entry's `namespaceSelector` (with the exclusions added).
    pub namespace_selector: Selector,
    /// Becomes the entry's `objectSelector`.
    pub pod_selector: Selector,
    /// Becomes the entry's `failurePolicy`.
    pub failure_policy: FailurePolicy,
}

/// A group's stable identifier: the same selectors give the same id in every replica and
/// across restarts, so a webhook configuration written by one replica is served by all.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(String);

impl GroupKey {
    /// The group of templates with these selectors and policy.
    pub fn new(
        namespace_selector: &Selector,
        pod_selector: &Selector,
        failure_policy: FailurePolicy,
    ) -> Self {
        Self {
            namespace_selector: namespace_selector.clone(),
            pod_selector: pod_selector.clone(),
            failure_policy,
        }
    }

    /// The id: `fail-` or `ignore-` and 16 hex digits of a hash of the canonical selectors.
    pub fn id(&self) -> GroupId {
        let mut hasher = Sha256::new();
        hasher.update(self.namespace_selector.to_string().as_bytes());
        hasher.update([0]);
        hasher.update(self.pod_selector.to_string().as_bytes());
        self.id_from(hasher)
    }

    /// The key and id of the group that merges every group of this namespace selector and
    /// policy: no pod selector, and an id hashed apart from every selector group's (so a
    /// replica that has not merged yet does not answer a merged entry with a part of its
    /// templates, but as a group it does not know).
    fn merged(&self) -> (GroupKey, GroupId) {
        let mut hasher = Sha256::new();
        hasher.update(self.namespace_selector.to_string().as_bytes());
        hasher.update([1]);
        let key = GroupKey {
            namespace_selector: self.namespace_selector.clone(),
            pod_selector: Selector::default(),
            failure_policy: self.failure_policy,
        };
        let id = self.id_from(hasher);
        (key, id)
    }

    fn id_from(&self, hasher: Sha256) -> GroupId {
        let digest = hasher.finalize();
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        let policy = match self.failure_policy {
            FailurePolicy::Fail => "fail",
            FailurePolicy::Ignore => "ignore",
        };
        GroupId(format!("{policy}-{hex}"))
    }
}

/// The most webhook entries the groups make before [`merge_past_bound`] merges some: each
/// entry is another call the API server may make for one Pod, and another caBundle in an
/// object that must stay well under what etcd accepts.
pub const MAX_GROUPS: usize = 64;

/// `groups` (one per key), with those sharing a namespace selector and a failure policy merged
/// into one group when there are more than [`MAX_GROUPS`]: the largest such sets first, until
/// at most `MAX_GROUPS` remain or nothing more can be merged.
///
/// A merged group has no pod selector, so its entry is called for every Pod of its namespaces
/// (for a required group: such Pods then depend on the webhook); each template still selects
/// Pods by its own pod selector, which the engine checks. Groups that differ in namespace
/// selector or failure policy are never merged: the webhook does not see a Pod's namespace
/// labels, and an entry has one policy. A whole set is merged or none of it, so the same
/// templates always make the same groups.
pub fn merge_past_bound(groups: Vec<Group>) -> Vec<Group> {
    if groups.len() <= MAX_GROUPS {
        return groups;
    }
    let class = |group: &Group| {
        (
            group.key.namespace_selector.clone(),
            group.key.failure_policy,
        )
    };
    let mut sizes: BTreeMap<(Selector, FailurePolicy), usize> = BTreeMap::new();
    for group in &groups {
        *sizes.entry(class(group)).or_default() += 1;
    }
    let mut largest_first: Vec<_> = sizes.into_iter().filter(|(_, size)| *size > 1).collect();
    largest_first.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut remaining = groups.len();
    let mut to_merge = BTreeSet::new();
    for (set, size) in largest_first {
        if remaining <= MAX_GROUPS {
            break;
        }
        remaining -= size - 1;
        to_merge.insert(set);
    }
    let mut kept = Vec::with_capacity(remaining);
    let mut merged: BTreeMap<(Selector, FailurePolicy), Group> = BTreeMap::new();
    for group in groups {
        let set = class(&group);
        if !to_merge.contains(&set) {
            kept.push(group);
            continue;
        }
        merged
            .entry(set)
            .or_insert_with(|| {
                let (key, id) = group.key.merged();
                Group {
                    id,
                    key,
                    templates: Vec::new(),
                }
            })
            .templates
            .extend(group.templates);
    }
    for mut group in merged.into_values() {
        group
            .templates
            .sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        kept.push(group);
    }
    kept
}

/// The `failurePolicy` a group id says its entry has (`fail-…` or `ignore-…`), `None` when it
/// is not shaped like an id. Lets a replica that does not know a group (it lags behind the
/// leader) still tell whether the entry that called it is a required one.
pub fn policy_of_id(id: &str) -> Option<FailurePolicy> {
    if id.starts_with("fail-") {
        Some(FailurePolicy::Fail)
    } else if id.starts_with("ignore-") {
        Some(FailurePolicy::Ignore)
    } else {
        None
    }
}

impl GroupId {
    /// The id as it appears in the path.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The webhook path that serves the group.
    pub fn path(&self) -> String {
        format!("/mutate/{}", self.0)
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lets a map keyed by `GroupId` be read with the `&str` of a request path, without
/// allocating (a `GroupId` hashes and compares as its string).
impl std::borrow::Borrow<str> for GroupId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for GroupId {
    fn from(id: &str) -> Self {
        GroupId(id.to_owned())
    }
}

/// The templates one webhook entry serves.
#[derive(Debug)]
pub struct Group {
    /// The entry's id (its path is `/mutate/<id>`).
    pub id: GroupId,
    /// The selectors and policy the templates share.
    pub key: GroupKey,
    /// The templates, in application order.
    pub templates: Vec<Arc<CompiledTemplate>>,
}

impl Group {
    /// The lowest priority of the group's templates: entries are ordered by it.
    pub fn priority(&self) -> i32 {
        self.templates.first().map_or(i32::MAX, |t| t.priority)
    }
}

#[cfg(test)]
mod tests;
