//! The AdmissionReview read in one pass by the pull reader ([`injector_core::json_pull`]), its
//! Pod decoded where the reader meets it ([`pull_pod_among`]), rather than skipped over to find
//! where it ends and parsed again: when the request's kind and operation came before its object,
//! as the API server writes them (else the object is kept as its text, and decoded after). A
//! review the API server does not write (for example a key read with an escape, an envelope key
//! given twice, a field read of another type than a review's or a Pod's, a Pod the planner
//! cannot plan or that runs out of its allowance) is refused here and
//! read the other way (the derived `Deserialize` of [`ReviewIn`], then
//! `pod_json::decode_pod_among`), which also gives each error its message; so a decision never
//! depends on which way its review was read.

use std::borrow::Cow;

use injector_core::Snapshot;
use injector_core::json_pull::{Reader, Refused, Result};
use injector_core::pod_json::pull_pod_among;
use serde_json::value::RawValue;

use super::{GroupVersionKind, RequestIn, ReviewIn};

/// How to decode a Pod met in the review: within this allowance, among these templates.
#[derive(Clone, Copy)]
pub(super) struct PodContext<'s> {
    pub(super) allowance: usize,
    pub(super) known: &'s Snapshot,
}

/// Reads `body`, decoding the object of a Pod CREATE with `pod` (`None`: kept as raw JSON).
pub(super) fn read<'a>(body: &'a [u8], pod: Option<PodContext<'_>>) -> Result<ReviewIn<'a>> {
    // Checked as a whole at once, the text need not be checked string by string; with SIMD,
    // where the standard library checks eight bytes a step.
    let text = simdutf8::basic::from_utf8(body).map_err(|_| Refused)?;
    let mut reader = Reader::new(text);
    let review = review(&mut reader, pod)?;
    reader.end()?;
    Ok(review)
}

/// Sets `slot` to `value`, unless the key was seen already (the derived way refuses it).
fn once<T>(slot: &mut Option<T>, value: T) -> Result<()> {
    if slot.is_some() {
        return Err(Refused);
    }
    *slot = Some(value);
    Ok(())
}

fn review<'a>(reader: &mut Reader<'a>, pod: Option<PodContext<'_>>) -> Result<ReviewIn<'a>> {
    let (mut api_version, mut kind, mut request) = (None, None, None);
    reader.object()?;
    let mut first = true;
    while let Some(key) = reader.key(&mut first)? {
        match key {
            "apiVersion" => once(&mut api_version, reader.string()?)?,
            "kind" => once(&mut kind, reader.string()?)?,
            "request" => {
                let value = if reader.null()? {
                    None
                } else {
                    Some(self::request(reader, pod)?)
                };
                once(&mut request, value)?;
            }
            _ => reader.skip()?,
        }
    }
    Ok(ReviewIn {
        api_version: api_version.unwrap_or_default(),
        kind: kind.unwrap_or_default(),
        request: request.flatten(),
    })
}

/// The fields of a request read so far.
#[derive(Default)]
struct RequestFields<'a> {
    uid: Option<Cow<'a, str>>,
    kind: Option<GroupVersionKind<'a>>,
    sub_resource: Option<Option<Cow<'a, str>>>,
    namespace: Option<Option<Cow<'a, str>>>,
    name: Option<Option<Cow<'a, str>>>,
    operation: Option<Cow<'a, str>>,
    object: Option<Option<&'a RawValue>>,
}

impl RequestFields<'_> {
    /// Whether what was read so far is of a Pod CREATE, as `decide` tells one.
    fn is_pod_create(&self) -> bool {
        self.kind
            .as_ref()
            .is_some_and(|k| k.group.is_empty() && k.kind == "Pod")
            && self.operation.as_deref() == Some("CREATE")
            && self
                .sub_resource
                .as_ref()
                .is_none_or(|s| s.as_deref().is_none_or(str::is_empty))
    }
}

fn request<'a>(reader: &mut Reader<'a>, pod: Option<PodContext<'_>>) -> Result<RequestIn<'a>> {
    let mut read = RequestFields::default();
    let mut decoded = None;
    reader.object()?;
    let mut first = true;
    while let Some(key) = reader.key(&mut first)? {
        match key {
            "uid" => once(&mut read.uid, reader.string()?)?,
            "kind" => once(&mut read.kind, group_version_kind(reader)?)?,
            "subResource" => once(&mut read.sub_resource, reader.string_or_null()?)?,
            "namespace" => once(&mut read.namespace, reader.string_or_null()?)?,
            "name" => once(&mut read.name, reader.string_or_null()?)?,
            "operation" => once(&mut read.operation, reader.string()?)?,
            "object" => {
                if read.object.is_some() || decoded.is_some() {
                    return Err(Refused);
                }
                match pod.filter(|_| read.is_pod_create()) {
                    Some(context) => {
                        decoded = Some(if reader.null()? {
                            None
                        } else {
                            Some(pull_pod_among(reader, context.allowance, context.known)?)
                        });
                    }
                    None => read.object = Some(raw_object(reader)?),
                }
            }
            _ => reader.skip()?,
        }
    }
    Ok(RequestIn {
        uid: read.uid.unwrap_or_default(),
        kind: read.kind.unwrap_or_default(),
        sub_resource: read.sub_resource.flatten(),
        namespace: read.namespace.flatten(),
        name: read.name.flatten(),
        operation: read.operation.unwrap_or_default(),
        object: read.object.flatten(),
        pod: decoded.flatten(),
    })
}

/// A request's `kind`: its group and kind (its version is not read).
fn group_version_kind<'a>(reader: &mut Reader<'a>) -> Result<GroupVersionKind<'a>> {
    let (mut group, mut kind) = (None, None);
    reader.object()?;
    let mut first = true;
    while let Some(key) = reader.key(&mut first)? {
        match key {
            "group" => once(&mut group, reader.string()?)?,
            "kind" => once(&mut kind, reader.string()?)?,
            _ => reader.skip()?,
        }
    }
    Ok(GroupVersionKind {
        group: group.unwrap_or_default(),
        kind: kind.unwrap_or_default(),
    })
}

/// An object not decoded as it is read, kept as its text (`None` for `null`).
fn raw_object<'a>(reader: &mut Reader<'a>) -> Result<Option<&'a RawValue>> {
    if reader.null()? {
        return Ok(None);
    }
    // Rare on the hot path (the webhook is called for Pod creations): `serde_json` checks the
    // text again to borrow it as a `RawValue`.
    serde_json::from_str(reader.raw()?).map_err(|_| Refused)
}

#[cfg(test)]
#[path = "one_pass/tests.rs"]
mod tests;
