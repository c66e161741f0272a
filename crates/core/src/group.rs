//! Selector groups: templates that share (namespaceSelector, podSelector, failurePolicy) are
//! served by one webhook entry, at `/mutate/<id>` (docs/architecture.md, decision 2). Past
//! [`MAX_GROUPS`] groups, those that differ only in their pod selector are merged
//! ([`merge_past_bound`], decision 19).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use injector_api::FailurePolicy;

pub(crate) mod key;

pub use key::{GroupId, GroupKey};

use crate::rules::selector::Selector;
use crate::template::CompiledTemplate;

/// The most webhook entries the groups make before `merge_past_bound` merges some: each
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
