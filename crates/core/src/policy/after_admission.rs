//! After admission: a ValidatingAdmissionPolicy that keeps a required template's containers in
//! a running Pod as they were injected, on every backend (admission alone only decides what a
//! Pod is created with; anyone who may update the Pod could replace the sidecar afterwards).
//!
//! It matches Pod UPDATEs of `pods` and `pods/resize`, only for a Pod whose stored record
//! (`sidecar.dev/injected`, of the old object) names a required template in force, and per
//! such template refuses the update unless the template's containers and init containers and
//! its record entry are unchanged, or the update is the operator's `InPlace` update to the
//! template's current version ([`crate::after_admission::rollout::in_place_patch`]) of a Pod stale only in
//! images: the entry rewritten to the current `name@generation#fingerprint` and the images of
//! its containers and native sidecars set to the template's, nothing else of them changed.
//! Whoever makes that update sets exactly the version the operator would, so it is not limited
//! to the operator's user. Volumes need no rule: the API server refuses any change of
//! `spec.volumes` on a Pod UPDATE.
//!
//! Not matched: `pods/ephemeralcontainers` (`kubectl debug` adds a debugging container beside
//! the injected ones and cannot change them), `pods/status` and `pods/binding`.

use std::collections::BTreeMap;
use std::sync::Arc;

use injector_api::names::INJECTED_ANNOTATION;
use injector_api::{FailurePolicy, UpdateStrategyType};
use serde_json::{Value, json};

use super::{
    POLICY_API_VERSION, PolicyOptions, cel_list, cel_string, validating_binding, version_hash,
};
use crate::after_admission::rollout::{fixed_field, image_of};
use crate::plan::Applied;
use crate::rules::record::ENTRY_NAME_CEL;
use crate::template::{CompiledTemplate, Item};

/// The after-admission policy and its binding.
#[derive(Clone, Debug)]
pub struct CompiledAfterAdmission {
    /// The ValidatingAdmissionPolicy.
    pub policy: Value,
    /// Its ValidatingAdmissionPolicyBinding (`Deny`).
    pub binding: Value,
    /// 16 hex digits of a SHA-256 of the policy: equal policies, equal hashes.
    pub hash: String,
    /// The templates it keeps, in application order.
    pub templates: Vec<String>,
}

/// The name of the after-admission policy (and binding) beside the policy `name`.
pub fn after_admission_name(name: &str) -> String {
    format!("{name}-after-admission")
}

/// The entries of the record of `object` (`oldObject` or `object`), trimmed, empty ones left out.
/// (`has` rather than optional fields here: the same expressions then run in the unit tests'
/// CEL interpreter, whose optional fields fail on a missing key.)
fn record_of(object: &str) -> String {
    let key = cel_string(INJECTED_ANNOTATION);
    format!(
        "(has({object}.metadata.annotations) && {key} in {object}.metadata.annotations ? {object}.metadata.annotations[{key}] : \"\").split(\",\").map(e, e.trim()).filter(e, e != \"\")"
    )
}

/// The policy keeping every required template of `templates` (those in force) that adds a
/// container or an init container; `None` when there is none, so that no Pod UPDATE pays for a
/// validation it does not need.
pub fn compile_after_admission(
    templates: &[Arc<CompiledTemplate>],
    options: &PolicyOptions,
) -> Option<CompiledAfterAdmission> {
    let mut kept: Vec<&Arc<CompiledTemplate>> = templates
        .iter()
        .filter(|t| t.failure_policy == FailurePolicy::Fail)
        .filter(|t| !t.containers.is_empty() || !t.init_containers.is_empty())
        .collect();
    kept.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    kept.dedup_by(|a, b| a.name == b.name);
    if kept.is_empty() {
        return None;
    }
    let names: Vec<&str> = kept.iter().map(|t| t.name.as_str()).collect();
    let validations: Vec<Value> = kept
        .iter()
        .map(|template| {
            json!({
                "expression": keeps(template),
                "message": format!(
                    "SidecarTemplate {:?} is required: its containers and init containers ({}) and its entry in {INJECTED_ANNOTATION} cannot change after admission; only the operator's in-place update to the template's current version may set their images",
                    template.name,
                    item_names(template).join(", ")
                ),
            })
        })
        .collect();
    let name = after_admission_name(&options.name);
    let policy = json!({
        "apiVersion": POLICY_API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            // A rule that fails to evaluate must not let a required sidecar be replaced.
            "failurePolicy": "Fail",
            "matchConstraints": {
                // Not `pods/ephemeralcontainers`, `pods/status` or `pods/binding`: see above.
                "resourceRules": [{
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["UPDATE"],
                    "resources": ["pods", "pods/resize"],
                }],
            },
            // Only a Pod recorded as carrying one of the templates is looked at.
            "matchConditions": [{
                "name": "carries-a-required-template",
                "expression": format!(
                    "{}.exists(e, {ENTRY_NAME_CEL} in {})",
                    record_of("oldObject"),
                    cel_list(names.iter().copied())
                ),
            }],
            "variables": [
                {"name": "oldRecord", "expression": record_of("oldObject")},
                {"name": "newRecord", "expression": record_of("object")},
                {"name": "oldInit", "expression": "has(oldObject.spec.initContainers) ? oldObject.spec.initContainers : []"},
                {"name": "newInit", "expression": "has(object.spec.initContainers) ? object.spec.initContainers : []"},
            ],
            "validations": validations,
        },
    });
    let hash = version_hash(options, std::slice::from_ref(&policy));
    let binding = validating_binding(&name, "Deny");
    Some(CompiledAfterAdmission {
        policy,
        binding,
        hash,
        templates: names.iter().map(|n| (*n).to_owned()).collect(),
    })
}

/// The names of the template's containers and init containers.
fn item_names(template: &CompiledTemplate) -> Vec<&str> {
    template
        .containers
        .iter()
        .chain(&template.init_containers)
        .map(|i| i.key.as_str())
        .collect()
}

/// The CEL condition that an UPDATE keeps `template` in the Pod: the old Pod's record does not
/// name it, or its containers, init containers and record entry are unchanged, or the update is
/// the operator's in-place update to its current version.
fn keeps(template: &CompiledTemplate) -> String {
    let name = cel_string(&template.name);
    let entries =
        |record: &str| format!("variables.{record}.filter(e, {ENTRY_NAME_CEL} == {name})");
    let names = cel_list(item_names(template).into_iter());
    let mut expression = format!(
        "!variables.oldRecord.exists(e, {ENTRY_NAME_CEL} == {name})\n|| ({} == {}\n  && object.spec.containers.filter(c, c.name in {names}) == oldObject.spec.containers.filter(c, c.name in {names})\n  && variables.newInit.filter(c, c.name in {names}) == variables.oldInit.filter(c, c.name in {names}))",
        entries("newRecord"),
        entries("oldRecord"),
    );
    if let Some(in_place) = in_place_update(template, &entries("oldRecord"), &entries("newRecord"))
    {
        expression.push_str("\n|| ");
        expression.push_str(&in_place);
    }
    expression
}

/// The CEL condition that an UPDATE is the operator's in-place update of a Pod to `template`'s
/// current version, as [`crate::after_admission::rollout::in_place_patch`] makes it for a Pod stale only in
/// images ([`crate::after_admission::lifecycle::carried`]): the record's one entry for it, of a version whose
/// fingerprint differs from the current one's only in its images half, moves to the current
/// one, and of the template's containers and native sidecars only the images change, to the
/// template's (resources too stay, so no `resize` passes); plain init containers stay as they
/// are. `None` when the operator never updates the template in place (not `InPlace`, or an
/// image not written out in the template).
fn in_place_update(template: &CompiledTemplate, old: &str, new: &str) -> Option<String> {
    if template.update_strategy.type_ != UpdateStrategyType::InPlace {
        return None;
    }
    let mut images = BTreeMap::new();
    let mut plain_init = Vec::new();
    for item in template.containers.iter().chain(&template.init_containers) {
        images.insert(item.key.as_str(), image_of(item)?);
    }
    for item in &template.init_containers {
        if !native_sidecar(item) {
            images.remove(item.key.as_str());
            plain_init.push(item.key.as_str());
        }
    }
    let current = cel_string(&Applied::of(template).to_string());
    // The first 8 of the fingerprint's 16 hex digits cover everything but the images.
    let fingerprint = template.fingerprint.to_string();
    let shape = cel_string(fingerprint.get(..8).unwrap_or_default());
    let image_map = format!(
        "{{{}}}",
        images
            .iter()
            .map(|(name, image)| format!("{}: {}", cel_string(name), cel_string(image)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let only_images = |new: &str, old: &str| {
        format!(
            "{new}.all(c, !(c.name in {image_map}) || {old}.exists(o, o.name == c.name && (o == c || (c.image == {image_map}[c.name] && has(o.resources) == has(c.resources) && (!has(o.resources) || o.resources == c.resources)))))"
        )
    };
    let stale_in_images = format!(
        "size({old}) == 1 && {old}.all(e, e != {current} && e.lastIndexOf(\"#\") >= 0 && size(e) - e.lastIndexOf(\"#\") == 17 && e.substring(e.lastIndexOf(\"#\") + 1).startsWith({shape}))"
    );
    let mut conditions = vec![
        stale_in_images,
        format!("{new} == [{current}]"),
        only_images("object.spec.containers", "oldObject.spec.containers"),
        only_images("variables.newInit", "variables.oldInit"),
    ];
    if !plain_init.is_empty() {
        let plain = cel_list(plain_init.into_iter());
        conditions.push(format!(
            "variables.newInit.filter(c, c.name in {plain}) == variables.oldInit.filter(c, c.name in {plain})"
        ));
    }
    Some(format!("({})", conditions.join("\n  && ")))
}

/// Whether an init container is a native sidecar (`restartPolicy: Always`), whose image the
/// operator may update in place.
fn native_sidecar(item: &Item) -> bool {
    fixed_field(item, "restartPolicy") == Some("Always")
}

#[cfg(test)]
mod tests;
