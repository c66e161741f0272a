//! The order of the webhook configuration's entries when templates depend on each other
//! across selector groups (issue 11, rule 7).
//!
//! A template may select Pods (`podSelector`) on a label another template adds
//! (`spec.metadata.labels`). The API server calls the entries in the configuration's order and
//! re-invokes only webhooks it already called, so the entry of the group that selects on the
//! label must come after the entry of the group that adds it, or it is never called for a Pod
//! that gets the label during admission. [`entry_order`] orders the groups topologically by
//! "adds a label key that the other's pod selector mentions"; among groups free to go next,
//! the lowest priority (then the id) goes first, so without dependencies the order is the
//! snapshot's (by lowest priority, then id).
//!
//! Groups that depend on each other in a cycle cannot all be satisfied: such a cycle is placed
//! as one block where its first group would go, in priority order inside, and returned in
//! [`EntryOrder::cycles`] for the operator to report (a warning when it applies the
//! configuration, and the `sidecar_injector_webhook_entry_cycles` metric).
//!
//! Pure: no I/O.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::sync::Arc;

use injector_core::{Group, Snapshot};

/// The groups in the order their entries go, and the dependency cycles met.
#[derive(Debug)]
pub struct EntryOrder<'a> {
    /// Every group of the snapshot, once, in entry order.
    pub groups: Vec<&'a Arc<Group>>,
    /// Each cycle: the names of the templates of its groups, sorted.
    pub cycles: Vec<Vec<String>>,
}

/// The label keys a pod selector mentions (in `matchLabels` or `matchExpressions`).
fn selector_keys(group: &Group) -> BTreeSet<String> {
    let selector = group.key.pod_selector.to_label_selector();
    let mut keys: BTreeSet<String> = selector
        .match_labels
        .into_iter()
        .flatten()
        .map(|(k, _)| k)
        .collect();
    keys.extend(
        selector
            .match_expressions
            .into_iter()
            .flatten()
            .map(|requirement| requirement.key),
    );
    keys
}

/// The label keys the templates of a group add to the Pod.
fn added_keys(group: &Group) -> BTreeSet<&str> {
    group
        .templates
        .iter()
        .flat_map(|t| t.labels.iter().map(|(key, _)| key.as_str()))
        .collect()
}

/// The order of `snapshot`'s groups for the webhook configuration: see the module doc.
pub fn entry_order(snapshot: &Snapshot) -> EntryOrder<'_> {
    let groups: Vec<&Arc<Group>> = snapshot.groups().iter().collect();
    let before = dependencies(&groups);
    if !before.iter().flatten().any(|&edge| edge) {
        return EntryOrder {
            groups,
            cycles: Vec::new(),
        };
    }
    let components = Components::of(&before);
    let mut ordered = Vec::with_capacity(groups.len());
    let mut cycles = Vec::new();
    for c in components.in_order(&before) {
        let members = &components.members[c];
        if members.len() > 1 {
            let mut names: Vec<String> = members
                .iter()
                .flat_map(|&g| groups[g].templates.iter().map(|t| t.name.clone()))
                .collect();
            names.sort();
            cycles.push(names);
        }
        ordered.extend(members.iter().map(|&g| groups[g]));
    }
    EntryOrder {
        groups: ordered,
        cycles,
    }
}

/// `before[i][j]`: group `i` must be called before group `j` (it adds a label key that `j`'s
/// pod selector mentions).
fn dependencies(groups: &[&Arc<Group>]) -> Vec<Vec<bool>> {
    let n = groups.len();
    let added: Vec<BTreeSet<&str>> = groups.iter().map(|g| added_keys(g)).collect();
    let selected: Vec<BTreeSet<String>> = groups.iter().map(|g| selector_keys(g)).collect();
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    i != j
                        && selected[j]
                            .iter()
                            .any(|key| added[i].contains(key.as_str()))
                })
                .collect()
        })
        .collect()
}

/// The groups in components: groups that reach each other are one (a cycle), the others
/// alone. The snapshot's order is by (priority, id), so a group's index is its rank.
struct Components {
    /// Each group's component.
    of: Vec<usize>,
    /// Each component's groups, by rank.
    members: Vec<Vec<usize>>,
}

impl Components {
    /// The components of the groups whose dependencies are `before`.
    fn of(before: &[Vec<bool>]) -> Self {
        let n = before.len();
        let reach = reachability(before);
        let mut of = vec![usize::MAX; n];
        let mut members: Vec<Vec<usize>> = Vec::new();
        for i in 0..n {
            if of[i] != usize::MAX {
                continue;
            }
            let id = members.len();
            let together: Vec<usize> = (i..n)
                .filter(|&j| j == i || (reach[i][j] && reach[j][i]))
                .collect();
            for &j in &together {
                of[j] = id;
            }
            members.push(together);
        }
        Components { of, members }
    }

    /// The components in the order their entries go: Kahn's algorithm on the dependencies
    /// `before` between their groups, the lowest-ranked ready component first (a component's
    /// rank is its first member's, the lowest).
    fn in_order(&self, before: &[Vec<bool>]) -> Vec<usize> {
        let count = self.members.len();
        let mut incoming = vec![0usize; count];
        let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); count];
        for (i, row) in before.iter().enumerate() {
            for (j, &edge) in row.iter().enumerate() {
                let (a, b) = (self.of[i], self.of[j]);
                if edge && a != b && edges[a].insert(b) {
                    incoming[b] += 1;
                }
            }
        }
        let mut ready: BinaryHeap<Reverse<(usize, usize)>> = (0..count)
            .filter(|&c| incoming[c] == 0)
            .map(|c| Reverse((self.members[c][0], c)))
            .collect();
        let mut order = Vec::with_capacity(count);
        while let Some(Reverse((_, c))) = ready.pop() {
            order.push(c);
            for &next in &edges[c] {
                incoming[next] -= 1;
                if incoming[next] == 0 {
                    ready.push(Reverse((self.members[next][0], next)));
                }
            }
        }
        order
    }
}

/// `reach[i][j]`: a path of one or more edges leads from `i` to `j`.
fn reachability(edges: &[Vec<bool>]) -> Vec<Vec<bool>> {
    let n = edges.len();
    let mut reach = vec![vec![false; n]; n];
    for (start, row) in reach.iter_mut().enumerate() {
        let mut stack: Vec<usize> = (0..n).filter(|&j| edges[start][j]).collect();
        while let Some(node) = stack.pop() {
            if row[node] {
                continue;
            }
            row[node] = true;
            stack.extend((0..n).filter(|&j| edges[node][j] && !row[j]));
        }
    }
    reach
}

#[cfg(test)]
mod tests;
