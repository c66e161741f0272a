//! The AdmissionReview read in one pass, its Pod decoded where the parser meets it, rather than
//! skipped over to find where it ends and parsed again. Only for reviews written as the API
//! server writes them: the request's kind and operation before its object, keys without
//! escapes, no key twice. Anything else fails here and is read the other way (the derived
//! `Deserialize` of [`ReviewIn`], then `pod_json::decode_pod_among`), which also gives each
//! error its message; so a decision never depends on which way its review was read. The one
//! pass is made by the quick reader ([`super::quick_json`]), or by `serde_json` where that
//! refuses the text.

use std::borrow::Cow;
use std::fmt;

use injector_core::pod_json::PodAmong;
use injector_core::{MalformedPod, Pod, Snapshot};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::quick_json::{Reader, Refused};
use super::{GroupVersionKind, RequestIn, ReviewIn};

/// How to decode a Pod met in the review: within this allowance, among these templates.
#[derive(Clone, Copy)]
pub(super) struct PodContext<'s> {
    pub(super) allowance: usize,
    pub(super) known: &'s Snapshot,
}

/// Reads `body`, decoding the object of a Pod CREATE with `pod` (`None`: kept as raw JSON).
pub(super) fn read<'a>(
    body: &'a [u8],
    pod: Option<PodContext<'_>>,
) -> Result<ReviewIn<'a>, serde_json::Error> {
    // Checked as a whole at once, the text need not be checked string by string; with SIMD,
    // where the standard library checks eight bytes a step.
    let text =
        simdutf8::basic::from_utf8(body).map_err(|_| de::Error::custom("the body is not UTF-8"))?;
    match read_quickly(text, pod) {
        Ok(review) => return Ok(review),
        // Through `serde_json`, the visitor would refuse the same: left to the other way.
        Err(Refused::ByVisitor) => return Err(de::Error::custom("refused in one pass")),
        Err(Refused::Unsure) => {}
    }
    let mut parser = serde_json::Deserializer::from_str(text);
    let review = parser.deserialize_map(ReviewVisitor { pod })?;
    parser.end()?;
    Ok(review)
}

/// Reads `text` with the quick reader, which refuses what it might not read as `serde_json`.
fn read_quickly<'a>(text: &'a str, pod: Option<PodContext<'_>>) -> Result<ReviewIn<'a>, Refused> {
    let mut reader = Reader::new(text);
    let review = (&mut reader).deserialize_map(ReviewVisitor { pod })?;
    reader.end()?;
    Ok(review)
}

/// Sets `slot` to `value`, unless the key was seen already.
fn once<T, E: de::Error>(slot: &mut Option<T>, key: &'static str, value: T) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(key));
    }
    *slot = Some(value);
    Ok(())
}

/// A string, borrowed from the body unless it has escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> de::Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(TextVisitor)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Text<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
        Ok(Text(Cow::Borrowed(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'de>, E> {
        Ok(Text(Cow::Owned(v.to_owned())))
    }
}

fn text<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Cow<'de, str>, A::Error> {
    map.next_value::<Text<'de>>().map(|t| t.0)
}

fn optional_text<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Option<Cow<'de, str>>, A::Error> {
    map.next_value::<Option<Text<'de>>>()
        .map(|t| t.map(|t| t.0))
}

struct ReviewVisitor<'s> {
    pod: Option<PodContext<'s>>,
}

impl<'de> Visitor<'de> for ReviewVisitor<'_> {
    type Value = ReviewIn<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an AdmissionReview")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ReviewIn<'de>, A::Error> {
        let (mut api_version, mut kind, mut request) = (None, None, None);
        while let Some(key) = map.next_key::<&'de str>()? {
            match key {
                "apiVersion" => once(&mut api_version, "apiVersion", text(&mut map)?)?,
                "kind" => once(&mut kind, "kind", text(&mut map)?)?,
                "request" => {
                    let value = map.next_value_seed(Optional(RequestVisitor { pod: self.pod }))?;
                    once(&mut request, "request", value)?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(ReviewIn {
            api_version: api_version.unwrap_or_default(),
            kind: kind.unwrap_or_default(),
            request: request.flatten(),
        })
    }
}

/// `null` or what the visitor reads.
struct Optional<V>(V);

impl<'de, V: Visitor<'de>> DeserializeSeed<'de> for Optional<V> {
    type Value = Option<V::Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Optional<V> {
    type Value = Option<V::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self.0).map(Some)
    }
}

struct RequestVisitor<'s> {
    pod: Option<PodContext<'s>>,
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
    pod: Option<Option<Result<Pod<'a>, MalformedPod>>>,
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

impl<'de> Visitor<'de> for RequestVisitor<'_> {
    type Value = RequestIn<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an admission request")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RequestIn<'de>, A::Error> {
        let mut read = RequestFields::default();
        while let Some(key) = map.next_key::<&'de str>()? {
            match key {
                "uid" => once(&mut read.uid, "uid", text(&mut map)?)?,
                "kind" => once(&mut read.kind, "kind", map.next_value()?)?,
                "subResource" => once(
                    &mut read.sub_resource,
                    "subResource",
                    optional_text(&mut map)?,
                )?,
                "namespace" => once(&mut read.namespace, "namespace", optional_text(&mut map)?)?,
                "name" => once(&mut read.name, "name", optional_text(&mut map)?)?,
                "operation" => once(&mut read.operation, "operation", text(&mut map)?)?,
                "object" => {
                    if read.object.is_some() || read.pod.is_some() {
                        return Err(de::Error::duplicate_field("object"));
                    }
                    match self.pod.filter(|_| read.is_pod_create()) {
                        Some(context) => {
                            let seed = PodAmong {
                                allowance: context.allowance,
                                known: context.known,
                            };
                            read.pod = Some(map.next_value_seed(OptionalPod(seed))?);
                        }
                        None => read.object = Some(map.next_value()?),
                    }
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
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
            pod: read.pod.flatten(),
        })
    }
}

/// `null` or a Pod.
struct OptionalPod<'k>(PodAmong<'k, Snapshot>);

impl<'de> DeserializeSeed<'de> for OptionalPod<'_> {
    type Value = Option<Result<Pod<'de>, MalformedPod>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for OptionalPod<'_> {
    type Value = Option<Result<Pod<'de>, MalformedPod>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Pod")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(deserializer).map(Some)
    }
}

#[cfg(test)]
#[path = "one_pass/tests.rs"]
mod tests;
