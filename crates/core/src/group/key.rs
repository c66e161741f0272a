//! A selector group's identity: the key its templates share and its stable id, which every
//! compiled template carries.

use std::fmt;

use injector_api::FailurePolicy;
use sha2::{Digest, Sha256};

use crate::rules::selector::Selector;

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
    pub(crate) fn merged(&self) -> (GroupKey, GroupId) {
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
