//! Selector groups: templates that share (namespaceSelector, podSelector, failurePolicy) are
//! served by one webhook entry, at `/mutate/<id>` (docs/architecture.md, decision 2).

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
        let digest = hasher.finalize();
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        let policy = match self.failure_policy {
            FailurePolicy::Fail => "fail",
            FailurePolicy::Ignore => "ignore",
        };
        GroupId(format!("{policy}-{hex}"))
    }
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
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn the_policy_is_read_back_from_an_id() {
        for policy in [FailurePolicy::Fail, FailurePolicy::Ignore] {
            let key = GroupKey::new(&Selector::default(), &Selector::default(), policy);
            assert_eq!(policy_of_id(key.id().as_str()), Some(policy));
        }
        assert_eq!(policy_of_id("failed"), None);
        assert_eq!(policy_of_id(""), None);
    }
}
