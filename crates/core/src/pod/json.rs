//! The Pod as the planner reads it ([`Pod`]), decoded from JSON with bounded memory.
//!
//! A `serde_json::Value` of a whole Pod costs up to a hundred times its JSON: `[{"":0},…]`
//! turns 7 bytes into a map node of ~600. A webhook that builds one lets any Pod author make a
//! replica take hundreds of MiB with one 3 MiB request. So the Pod is decoded here instead,
//! into the typed [`Pod`], borrowing its strings from the JSON:
//!
//! - only what the planner reads is built; everything else (status, managedFields, probes,
//!   resources, …) is skipped by the parser unbuilt;
//! - a container, a volume or an env var of a container is kept whole (as a `Value`) only when
//!   a known template adds one of its name ([`decode_pod_among`]): planning compares one whole
//!   only with a template's of the same name; a container's envFrom sources are built only
//!   when a known template adds envFrom sources, else skipped like any field not read (so, as
//!   there, what the parser skips it checks only as JSON);
//! - where a field holds another JSON type than a Pod's, the decoder records only that, so the
//!   planner's [`MalformedPod`] error is the one [`Pod::from_value`] gives;
//! - what is built is charged against an allowance of [`COST_PER_BYTE`] times the JSON's size,
//!   at an upper bound of what each value allocates; past it decoding stops with
//!   [`PodJsonError::TooComplex`].
//!
//! So a Pod costs at most a fixed multiple of its size whatever its shape, which is what lets
//! the webhook reserve memory for a request before reading it.
//!
//! This decoder goes through `serde` and reads any JSON.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::mem::size_of;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::pod::MalformedPod;
use crate::pod::{
    Container, EnvVar, Mount, Pod, Str, Strings, Volume, holds_service_account_token, name_of,
};
use crate::registry::KnownTemplates;

/// The allowance, in bytes of memory per byte of JSON, for decoding a Pod. A real Pod takes a
/// small fraction of it; a `Value` kept whole costs 10–30 times its JSON and is charged about
/// 1.7 times what it allocates; hostile shapes (lists of empty maps) would cost more and are
/// stopped.
pub const COST_PER_BYTE: usize = 48;

/// The smallest allowance: a map's first node costs more than a tiny Pod's JSON.
pub const MIN_ALLOWANCE: usize = 64 * 1024;

/// Why a Pod was not decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PodJsonError {
    /// Not JSON, or JSON nested deeper than the parser allows.
    #[error("the Pod is not valid JSON: {0}")]
    Invalid(String),
    /// JSON, but a field the planner reads has the wrong type or is missing.
    #[error(transparent)]
    Malformed(#[from] MalformedPod),
    /// Decoding would take more than the allowance.
    #[error(
        "the Pod's fields would take more than {allowance} bytes of memory to inspect (the \
         allowance for its {size} bytes of JSON): it is made of too many tiny values"
    )]
    TooComplex {
        /// The JSON's size.
        size: usize,
        /// The allowance it gave.
        allowance: usize,
    },
}

/// The items of a Pod planning compares whole only with a template's of the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Named {
    /// A container or an init container.
    Container,
    /// A volume.
    Volume,
    /// An env var of a container (of the Pod's own, unless the container is kept whole).
    Env,
    /// A volume mount of a container, by its path (of the Pod's own, unless the container is
    /// kept whole).
    Mount,
    /// The envFrom sources of a container (of the Pod's own, unless the container is kept
    /// whole), asked with an empty name: without them the list is kept empty.
    EnvFrom,
}

/// Which named items are kept whole: `None` every one, else those of the names it says.
pub type Whole<'w> = Option<&'w dyn Fn(Named, &str) -> bool>;

/// A decoded Pod and what building it was charged.
#[derive(Clone, Debug)]
pub struct Decoded<'j> {
    /// The Pod.
    pub pod: Pod<'j>,
    /// The bytes charged against the allowance.
    pub charged: usize,
}

/// Decodes `json`, a Pod, within `allowance` bytes (see [`allowance`]), keeping every
/// container, volume and env var whole: it plans as [`Pod::from_value`] of the whole `Value`.
pub fn decode_pod(json: &str, allowance: usize) -> Result<Pod<'_>, PodJsonError> {
    decode(json, allowance, None).map(|decoded| decoded.pod)
}

/// Decodes `json`, a Pod to plan with [`plan_among`](crate::plan_among) among `known` (every
/// template in force), within `allowance` bytes: a container, a volume or an env var of a
/// container is kept whole only when a known template adds one of its name (what planning
/// compares whole), and a container's envFrom sources only when one adds envFrom sources.
/// Planning either gives the same plan.
///
/// A Pod that names such an item after its other fields (the API server never does) is
/// decoded again with every item whole, once the first one is dropped.
pub fn decode_pod_among<'j>(
    json: &'j str,
    allowance: usize,
    known: &(impl KnownTemplates + ?Sized),
) -> Result<Pod<'j>, PodJsonError> {
    let whole = |named: Named, name: &str| adds(known, named, name);
    decode(json, allowance, Some(&whole)).map(|decoded| decoded.pod)
}

/// Decodes `json`, keeping whole the named items `whole` says, within `allowance` bytes.
pub fn decode<'j>(
    json: &'j str,
    allowance: usize,
    whole: Whole<'_>,
) -> Result<Decoded<'j>, PodJsonError> {
    let state = State::new(allowance, whole);
    let mut parser = serde_json::Deserializer::from_str(json);
    let decoded = PodSeed { state: &state }
        .deserialize(&mut parser)
        .and_then(|pod| parser.end().map(|()| pod));
    if state.incomplete.get() && decoded.is_ok() {
        // Dropped first: the second decoding has the whole allowance.
        drop(decoded);
        return decode(json, allowance, None);
    }
    match decoded {
        Ok(pod) => Ok(Decoded {
            pod: pod?,
            charged: allowance - state.budget.left.get(),
        }),
        Err(_) if state.budget.exceeded.get() => Err(PodJsonError::TooComplex {
            size: json.len(),
            allowance,
        }),
        Err(error) => Err(PodJsonError::Invalid(error.to_string())),
    }
}

/// The memory `json` may take to decode: [`COST_PER_BYTE`] × its size, at least
/// [`MIN_ALLOWANCE`].
pub fn allowance(json_len: usize) -> usize {
    json_len.saturating_mul(COST_PER_BYTE).max(MIN_ALLOWANCE)
}

/// Whether a known template adds a `named` item called `name`.
fn adds(known: &(impl KnownTemplates + ?Sized), named: Named, name: &str) -> bool {
    match named {
        Named::Container => known.adding_container(name).next().is_some(),
        Named::Volume => known.adds_volume(name),
        Named::Env => known.adds_app_env(name),
        Named::Mount => known.adds_app_mount(name),
        Named::EnvFrom => known.adds_app_env_from(),
    }
}

/// Upper bounds of what building a value allocates, with the allocator's rounding and the
/// containers' spare capacity.
mod cost {
    /// A list's first `Value`: its `Vec` starts with room for 4 (of 32 bytes).
    pub const LIST_FIRST_ITEM: usize = 128;
    /// A further `Value` in a `Vec` that grows by doubling: up to twice its 32 bytes, and
    /// while the `Vec` moves to a block twice as large, the old block as well.
    pub const LIST_ITEM: usize = 96;
    /// An entry of a `BTreeMap<String, Value>`: its 56 bytes in a node at least half full, and
    /// the inner nodes above.
    pub const MAP_ENTRY: usize = 160;
    /// A map's first node, allocated whole (11 entries' room) for its first entry.
    pub const MAP_FIRST_NODE: usize = 640;
    /// A string's heap block: its bytes rounded up, and the allocator's header.
    pub fn string(len: usize) -> usize {
        len.div_ceil(16) * 16 + 16
    }
    /// An item of `size` bytes in a `Vec` that grows by doubling (as [`LIST_ITEM`]), or the
    /// list's first, which makes room for 4.
    pub fn item(size: usize, first: bool) -> usize {
        if first { 4 * size + 16 } else { 3 * size }
    }
    /// Sorting a list of items of `size` bytes: a stable sort's scratch buffer, up to the
    /// list's size.
    pub fn sort(size: usize) -> usize {
        size
    }
}

/// The memory left to decode with.
struct Budget {
    left: Cell<usize>,
    exceeded: Cell<bool>,
}

impl Budget {
    fn charge<E: de::Error>(&self, bytes: usize) -> Result<(), E> {
        if self.spend(bytes) {
            Ok(())
        } else {
            Err(spent())
        }
    }

    /// Takes `bytes` from what is left: whether there were as many.
    fn spend(&self, bytes: usize) -> bool {
        match self.left.get().checked_sub(bytes) {
            Some(left) => {
                self.left.set(left);
                true
            }
            None => {
                self.exceeded.set(true);
                false
            }
        }
    }
}

/// The parser's error once the allowance is spent (`Budget::exceeded` tells it apart).
fn spent<E: de::Error>() -> E {
    E::custom("the memory allowance for decoding the Pod is spent")
}

/// What one decoding shares.
struct State<'w> {
    budget: Budget,
    whole: Whole<'w>,
    /// Set when an item's name asked for it whole after its other fields were skipped.
    incomplete: Cell<bool>,
}

impl<'w> State<'w> {
    fn new(allowance: usize, whole: Whole<'w>) -> Self {
        State {
            budget: Budget {
                left: Cell::new(allowance),
                exceeded: Cell::new(false),
            },
            whole,
            incomplete: Cell::new(false),
        }
    }

    /// Whether a `named` item called `name` is kept whole.
    fn wants(&self, named: Named, name: &str) -> bool {
        self.whole.is_none_or(|whole| whole(named, name))
    }

    /// A string of the JSON, copied only when it had escapes.
    fn text<'de, E: de::Error>(&self, text: Text<'de, '_>) -> Result<Str<'de>, E> {
        match text {
            Text::Borrowed(text) => Ok(Cow::Borrowed(text)),
            Text::Transient(text) => {
                // Unescaped into the parser's scratch buffer, which grows by doubling.
                self.budget
                    .charge(cost::string(text.len()) + 2 * text.len())?;
                Ok(Cow::Owned(text.to_owned()))
            }
        }
    }

    /// Charges the `Vec` an item of type `T` is pushed to.
    fn charge_item<T, E: de::Error>(&self, first: bool) -> Result<(), E> {
        self.budget.charge(cost::item(size_of::<T>(), first))
    }
}

/// A string as the parser gives it.
enum Text<'de, 'a> {
    /// In the JSON, without escapes.
    Borrowed(&'de str),
    /// Unescaped, valid until the parser moves on.
    Transient(&'a str),
}

/// What a field of the Pod is expected to hold, and what to make of what it does hold. Every
/// JSON type is accepted: a value of another type than expected becomes [`Expect::other`],
/// its content skipped.
trait Expect<'de>: Sized {
    type Out;

    /// What a value of another type than expected (and `null`, unless [`Expect::null`] says
    /// otherwise) becomes.
    fn other(self) -> Self::Out;

    fn null(self) -> Self::Out {
        self.other()
    }

    fn boolean(self, _value: bool) -> Self::Out {
        self.other()
    }

    fn string<E: de::Error>(self, _text: Text<'de, '_>) -> Result<Self::Out, E> {
        Ok(self.other())
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Out, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(self.other())
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Out, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(self.other())
    }
}

/// Decodes a value as `E` expects.
struct Seed<E>(E);

impl<'de, E: Expect<'de>> DeserializeSeed<'de> for Seed<E> {
    type Value = E::Out;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<E::Out, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, X: Expect<'de>> Visitor<'de> for Seed<X> {
    type Value = X::Out;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<X::Out, E> {
        Ok(self.0.boolean(v))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<X::Out, E> {
        Ok(self.0.other())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<X::Out, E> {
        Ok(self.0.other())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<X::Out, E> {
        Ok(self.0.other())
    }

    fn visit_unit<E: de::Error>(self) -> Result<X::Out, E> {
        Ok(self.0.null())
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<X::Out, E> {
        self.0.string(Text::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<X::Out, E> {
        self.0.string(Text::Transient(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<X::Out, A::Error> {
        self.0.seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<X::Out, A::Error> {
        self.0.map(map)
    }
}

/// A field of the type expected, absent (or `null`), or of another type.
#[derive(Default)]
enum Shape<T> {
    #[default]
    Absent,
    Wrong,
    Is(T),
}

impl<T> From<Option<T>> for Shape<T> {
    fn from(value: Option<T>) -> Self {
        value.map_or(Shape::Absent, Shape::Is)
    }
}

impl<T> Shape<T> {
    /// `Ok(None)` when absent, the error `wrong` gives when of another type.
    fn optional(self, wrong: impl FnOnce() -> String) -> Result<Option<T>, MalformedPod> {
        match self {
            Shape::Absent => Ok(None),
            Shape::Wrong => Err(MalformedPod::new(wrong())),
            Shape::Is(value) => Ok(Some(value)),
        }
    }
}

/// The Pod's root object.
struct PodSeed<'s, 'w> {
    state: &'s State<'w>,
}

impl<'de> DeserializeSeed<'de> for PodSeed<'_, '_> {
    type Value = Result<Pod<'de>, MalformedPod>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        let shape = Seed(Object(PodFields { state: self.state })).deserialize(deserializer)?;
        Ok(assemble(shape))
    }
}

/// The fields of the Pod the planner reads, as found.
#[derive(Default)]
struct RawPod<'a> {
    metadata: Shape<RawMetadata<'a>>,
    spec: Shape<RawSpec<'a>>,
}

#[derive(Default)]
struct RawMetadata<'a> {
    name: Option<Str<'a>>,
    generate_name: Option<Str<'a>>,
    namespace: Option<Str<'a>>,
    labels: Shape<Strings<'a>>,
    annotations: Shape<Strings<'a>>,
}

#[derive(Default)]
struct RawSpec<'a> {
    /// `None` for an item that is not an object.
    containers: Shape<Vec<Option<Container<'a>>>>,
    init_containers: Shape<Vec<Option<Container<'a>>>>,
    volumes: Shape<Vec<Volume<'a>>>,
    image_pull_secrets: Shape<Vec<Str<'a>>>,
    host_network: bool,
    token_automount_off: bool,
    service_account_name: Option<Str<'a>>,
    service_account: Option<Str<'a>>,
}

/// The Pod from what was found, or why it is not one: the checks and messages of
/// [`Pod::from_value`], in its order.
fn assemble<'a>(found: Shape<RawPod<'a>>) -> Result<Pod<'a>, MalformedPod> {
    let Shape::Is(pod) = found else {
        return Err(MalformedPod::new("the object is not a JSON object"));
    };
    let metadata = pod
        .metadata
        .optional(|| "metadata is not an object".into())?;
    let spec = pod
        .spec
        .optional(|| "spec is not an object".into())?
        .ok_or_else(|| MalformedPod::new("spec is missing"))?;
    let containers = spec
        .containers
        .optional(|| "spec.containers is not a list".into())?
        .ok_or_else(|| MalformedPod::new("spec.containers is missing"))?;
    let init_containers = spec
        .init_containers
        .optional(|| "spec.initContainers is not a list".into())?;
    let objects = |field: &str, list: Vec<Option<Container<'a>>>| {
        list.into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| MalformedPod::new(format!("{field} holds a non-object")))
    };
    let containers = objects("spec.containers", containers)?;
    let init_containers = init_containers
        .map(|list| objects("spec.initContainers", list))
        .transpose()?;
    let (has_metadata, metadata) = match metadata {
        Some(metadata) => (true, metadata),
        None => (false, RawMetadata::default()),
    };
    let labels = metadata
        .labels
        .optional(|| "metadata.labels is not an object".into())?;
    let annotations = metadata
        .annotations
        .optional(|| "metadata.annotations is not an object".into())?;
    let volumes = spec
        .volumes
        .optional(|| "spec.volumes is not a list".into())?;
    let image_pull_secrets = spec
        .image_pull_secrets
        .optional(|| "spec.imagePullSecrets is not a list".into())?;
    Ok(Pod {
        has_metadata,
        name: metadata.name.or(metadata.generate_name).unwrap_or_default(),
        namespace: metadata.namespace,
        service_account_name: spec
            .service_account_name
            .or(spec.service_account)
            .unwrap_or(Cow::Borrowed("default")),
        labels,
        annotations,
        containers,
        init_containers,
        volumes,
        image_pull_secrets,
        host_network: spec.host_network,
        token_automount_off: spec.token_automount_off,
    })
}

/// An object whose fields `F` reads; of another type: [`Shape::Wrong`].
struct Object<F>(F);

/// Reads an object's fields.
trait Fields<'de>: Sized {
    type Out: Default;

    /// Reads the value of `key` into `out`; `false` when it is not read (it is skipped).
    fn field<A: MapAccess<'de>>(
        &self,
        key: &str,
        map: &mut A,
        out: &mut Self::Out,
    ) -> Result<bool, A::Error>;
}

impl<'de, F: Fields<'de>> Expect<'de> for Object<F> {
    type Out = Shape<F::Out>;

    fn other(self) -> Self::Out {
        Shape::Wrong
    }

    fn null(self) -> Self::Out {
        Shape::Absent
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Out, A::Error> {
        let mut out = F::Out::default();
        while let Some(key) = map.next_key_seed(Key)? {
            if !self.0.field(key.as_str(), &mut map, &mut out)? {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Shape::Is(out))
    }
}

/// A list of what `I` expects of each item; of another type: [`Shape::Wrong`].
struct List<'s, 'w, I> {
    state: &'s State<'w>,
    item: I,
}

impl<'de, I: Expect<'de> + Copy> Expect<'de> for List<'_, '_, I> {
    type Out = Shape<Vec<I::Out>>;

    fn other(self) -> Self::Out {
        Shape::Wrong
    }

    fn null(self) -> Self::Out {
        Shape::Absent
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Out, A::Error> {
        let mut items = Vec::new();
        loop {
            self.state.charge_item::<I::Out, _>(items.is_empty())?;
            match seq.next_element_seed(Seed(self.item))? {
                Some(item) => items.push(item),
                None => return Ok(Shape::Is(items)),
            }
        }
    }
}

/// A list, as `Some` only when it is one.
fn list_of<'de, I: Expect<'de> + Copy, A: MapAccess<'de>>(
    state: &State<'_>,
    item: I,
    map: &mut A,
) -> Result<Option<Vec<I::Out>>, A::Error> {
    match map.next_value_seed(Seed(List { state, item }))? {
        Shape::Is(items) => Ok(Some(items)),
        Shape::Absent | Shape::Wrong => Ok(None),
    }
}

struct PodFields<'s, 'w> {
    state: &'s State<'w>,
}

impl<'de> Fields<'de> for PodFields<'_, '_> {
    type Out = RawPod<'de>;

    fn field<A: MapAccess<'de>>(
        &self,
        key: &str,
        map: &mut A,
        out: &mut RawPod<'de>,
    ) -> Result<bool, A::Error> {
        let state = self.state;
        match key {
            "metadata" => {
                out.metadata = map.next_value_seed(Seed(Object(MetadataFields { state })))?
            }
            "spec" => out.spec = map.next_value_seed(Seed(Object(SpecFields { state })))?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

struct MetadataFields<'s, 'w> {
    state: &'s State<'w>,
}

impl<'de> Fields<'de> for MetadataFields<'_, '_> {
    type Out = RawMetadata<'de>;

    fn field<A: MapAccess<'de>>(
        &self,
        key: &str,
        map: &mut A,
        out: &mut RawMetadata<'de>,
    ) -> Result<bool, A::Error> {
        let state = self.state;
        let text = |map: &mut A| map.next_value_seed(Seed(NonEmpty { state }));
        match key {
            "name" => out.name = text(map)?,
            "generateName" => out.generate_name = text(map)?,
            "namespace" => out.namespace = text(map)?,
            "labels" => out.labels = map.next_value_seed(Seed(StringMap { state }))?,
            "annotations" => out.annotations = map.next_value_seed(Seed(StringMap { state }))?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

struct SpecFields<'s, 'w> {
    state: &'s State<'w>,
}

impl<'de> Fields<'de> for SpecFields<'_, '_> {
    type Out = RawSpec<'de>;

    fn field<A: MapAccess<'de>>(
        &self,
        key: &str,
        map: &mut A,
        out: &mut RawSpec<'de>,
    ) -> Result<bool, A::Error> {
        let state = self.state;
        let containers = |map: &mut A| {
            let item = ContainerItem { state };
            map.next_value_seed(Seed(List { state, item }))
        };
        match key {
            "containers" => out.containers = containers(map)?,
            "initContainers" => out.init_containers = containers(map)?,
            "volumes" => {
                let item = VolumeItem { state };
                out.volumes = map.next_value_seed(Seed(List { state, item }))?
            }
            "imagePullSecrets" => {
                let item = NameOf { state };
                out.image_pull_secrets = map.next_value_seed(Seed(List { state, item }))?
            }
            "hostNetwork" => out.host_network = map.next_value_seed(Seed(IsTrue))?,
            "automountServiceAccountToken" => {
                out.token_automount_off = map.next_value_seed(Seed(IsFalse))?
            }
            "serviceAccountName" => {
                out.service_account_name = map.next_value_seed(Seed(NonEmpty { state }))?
            }
            "serviceAccount" => {
                out.service_account = map.next_value_seed(Seed(NonEmpty { state }))?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// A non-empty string; else `None`.
#[derive(Clone, Copy)]
struct NonEmpty<'s, 'w> {
    state: &'s State<'w>,
}

impl<'de> Expect<'de> for NonEmpty<'_, '_> {
    type Out = Option<Str<'de>>;

    fn other(self) -> Self::Out {
        None
    }

    fn string<E: de::Error>(self, text: Text<'de, '_>) -> Result<Self::Out, E> {
        let text = self.state.text(text)?;
        Ok((!text.is_empty()).then_some(text))
    }
}

/// A string; else `None`.
#[derive(Clone, Copy)]
struct AnyString<'s, 'w> {
    state: &'s State<'w>,
}

impl<'de> Expect<'de> for AnyString<'_, '_> {
    type Out = Option<Str<'de>>;

    fn other(self) -> Self::Out {
        None
    }

    fn string<E: de::Error>(self, text: Text<'de, '_>) -> Result<Self::Out, E> {
        self.state.text(text).map(Some)
    }
}

/// `true`; anything else is `false`.
#[derive(Clone, Copy)]
struct IsTrue;

impl<'de> Expect<'de> for IsTrue {
    type Out = bool;

    fn other(self) -> bool {
        false
    }

    fn boolean(self, value: bool) -> bool {
        value
    }
}

/// Whether a value is `false` (anything else, `true` included, is not).
#[derive(Clone, Copy)]
struct IsFalse;

impl<'de> Expect<'de> for IsFalse {
    type Out = bool;

    fn other(self) -> bool {
        false
    }

    fn boolean(self, value: bool) -> bool {
        !value
    }
}

/// Whether a value is a list; its items are skipped.
#[derive(Clone, Copy)]
struct IsList;

impl<'de> Expect<'de> for IsList {
    type Out = bool;

    fn other(self) -> bool {
        false
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(true)
    }
}

/// Labels or annotations: an object of strings.
struct StringMap<'s, 'w> {
    state: &'s State<'w>,
}

impl<'de> Expect<'de> for StringMap<'_, '_> {
    type Out = Shape<Strings<'de>>;

    fn other(self) -> Self::Out {
        Shape::Wrong
    }

    fn null(self) -> Self::Out {
        Shape::Absent
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Out, A::Error> {
        let state = self.state;
        let mut entries = Vec::new();
        while let Some(key) = map.next_key_seed(Key)? {
            state.charge_item::<(Str<'de>, Option<Str<'de>>), _>(entries.is_empty())?;
            state
                .budget
                .charge(cost::sort(size_of::<(Str<'de>, Option<Str<'de>>)>()))?;
            let key = match key {
                KeyText::Borrowed(key) => Cow::Borrowed(key),
                KeyText::Owned(key) => {
                    state.budget.charge(cost::string(key.len()))?;
                    Cow::Owned(key)
                }
            };
            let value = map.next_value_seed(Seed(AnyString { state }))?;
            entries.push((key, value));
        }
        Ok(Shape::Is(Strings::from_entries(entries)))
    }
}

/// The `name` of an object; empty for anything else.
#[derive(Clone, Copy)]
struct NameOf<'s, 'w> {
    state: &'s State<'w>,
}

impl<'de> Expect<'de> for NameOf<'_, '_> {
    type Out = Str<'de>;

    fn other(self) -> Self::Out {
        Cow::Borrowed("")
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Out, A::Error> {
        let mut name = Cow::Borrowed("");
        while let Some(key) = map.next_key_seed(Key)? {
            if key.as_str() == "name" {
                name = item_name(self.state, &mut map)?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(name)
    }
}

/// The value of a `name` field: a string, else empty (as the planner reads it).
fn item_name<'de, A: MapAccess<'de>>(state: &State<'_>, map: &mut A) -> Result<Str<'de>, A::Error> {
    Ok(map
        .next_value_seed(Seed(AnyString { state }))?
        .unwrap_or_default())
}

/// A whole value, built within the budget.
#[derive(Clone, Copy)]
struct WholeValue<'s, 'w> {
    state: &'s State<'w>,
}

impl<'de> DeserializeSeed<'de> for WholeValue<'_, '_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for WholeValue<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Value, E> {
        self.state.budget.charge(cost::string(v.len()))?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        // Not borrowed: unescaped into the parser's scratch buffer, which grows by doubling.
        self.state
            .budget
            .charge(cost::string(v.len()) + 2 * v.len())?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            self.state.budget.charge(if items.is_empty() {
                cost::LIST_FIRST_ITEM
            } else {
                cost::LIST_ITEM
            })?;
            match seq.next_element_seed(self)? {
                Some(value) => items.push(value),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        whole_object(self.state, Map::new(), map).map(Value::Object)
    }
}

/// The rest of an object, whole, after the fields already in `object`.
fn whole_object<'de, A: MapAccess<'de>>(
    state: &State<'_>,
    mut object: Map<String, Value>,
    mut map: A,
) -> Result<Map<String, Value>, A::Error> {
    while let Some(key) = map.next_key_seed(Key)? {
        let first_node = if object.is_empty() {
            cost::MAP_FIRST_NODE
        } else {
            0
        };
        state
            .budget
            .charge(first_node + cost::MAP_ENTRY + cost::string(key.as_str().len()))?;
        let value = map.next_value_seed(WholeValue { state })?;
        object.insert(key.into_owned(), value);
    }
    Ok(object)
}

/// An object whose first field is `name` (already read), the rest whole.
fn named_whole<'de, A: MapAccess<'de>>(
    state: &State<'_>,
    name: &str,
    map: A,
) -> Result<Value, A::Error> {
    state.budget.charge(
        cost::MAP_FIRST_NODE + cost::MAP_ENTRY + cost::string(4) + cost::string(name.len()),
    )?;
    let mut object = Map::new();
    object.insert("name".to_owned(), Value::String(name.to_owned()));
    whole_object(state, object, map).map(Value::Object)
}

/// A container read whole, and its name copied out of it.
fn whole_container<E: de::Error>(
    state: &State<'_>,
    container: Value,
) -> Result<Container<'static>, E> {
    state
        .budget
        .charge(cost::string(name_of(&container).len()))?;
    Ok(Container::of_owned(container))
}

/// A container or an init container; `None` when not an object.
#[derive(Clone, Copy)]
struct ContainerItem<'s, 'w> {
    state: &'s State<'w>,
}

impl<'de> Expect<'de> for ContainerItem<'_, '_> {
    type Out = Option<Container<'de>>;

    fn other(self) -> Self::Out {
        None
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Out, A::Error> {
        let state = self.state;
        if state.whole.is_none() {
            let container = Value::Object(whole_object(state, Map::new(), map)?);
            return whole_container(state, container).map(Some);
        }
        let mut container = Container::default();
        let mut first = true;
        while let Some(key) = map.next_key_seed(Key)? {
            let is_first = std::mem::replace(&mut first, false);
            match key.as_str() {
                "name" => {
                    let name = item_name(state, &mut map)?;
                    if state.wants(Named::Container, &name) {
                        if is_first {
                            let whole = named_whole(state, &name, map)?;
                            return whole_container(state, whole).map(Some);
                        }
                        state.incomplete.set(true);
                    }
                    container.name = name;
                }
                "env" => container.env = list_of(state, EnvItem { state }, &mut map)?,
                "envFrom" if state.wants(Named::EnvFrom, "") => {
                    let env_from = map.next_value_seed(WholeValue { state })?;
                    container.env_from = env_from.is_array().then_some(Cow::Owned(env_from));
                }
                "envFrom" => {
                    // Planning reads only whether there is a list: an empty one stands for it.
                    let is_list = map.next_value_seed(Seed(IsList))?;
                    container.env_from = is_list.then_some(Cow::Owned(Value::Array(Vec::new())));
                }
                "volumeMounts" => {
                    container.volume_mounts = list_of(state, MountItem { state }, &mut map)?
                }
                "restartPolicy" => {
                    let policy = map.next_value_seed(Seed(AnyString { state }))?;
                    container.native_sidecar = policy.as_deref() == Some("Always");
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(container))
    }
}

/// An env var of a container.
#[derive(Clone, Copy)]
struct EnvItem<'s, 'w> {
    state: &'s State<'w>,
}

impl<'de> Expect<'de> for EnvItem<'_, '_> {
    type Out = EnvVar<'de>;

    fn other(self) -> Self::Out {
        EnvVar::default()
    }

    // Read only where containers are not kept whole (a container kept whole holds its env).
    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Out, A::Error> {
        let state = self.state;
        let mut name = Cow::Borrowed("");
        let mut first = true;
        while let Some(key) = map.next_key_seed(Key)? {
            let is_first = std::mem::replace(&mut first, false);
            if key.as_str() != "name" {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            name = item_name(state, &mut map)?;
            if state.wants(Named::Env, &name) {
                if is_first {
                    let whole = named_whole(state, &name, map)?;
                    // Named by its last `name`, as a JSON object reads.
                    let name = name_of(&whole).to_owned();
                    state.budget.charge(cost::string(name.len()))?;
                    return Ok(EnvVar {
                        name: Cow::Owned(name),
                        whole: Some(Cow::Owned(whole)),
                    });
                }
                state.incomplete.set(true);
            }
        }
        Ok(EnvVar { name, whole: None })
    }
}

/// A volume mount of a container: its path, and all of it when a template mounts a volume
/// there. Its fields (name, readOnly, mountPath, …) are strings and booleans, kept aside
/// unbuilt until the path is known; a mount kept whole with a field of another kind, or with
/// more fields than a mount has, makes the Pod decoded again whole.
#[derive(Clone, Copy)]
struct MountItem<'s, 'w> {
    state: &'s State<'w>,
}

/// The most fields a mount is kept aside with.
const MOUNT_FIELDS: usize = 8;

/// A string, a boolean or null.
enum Scalar<'a> {
    Null,
    Bool(bool),
    Str(Str<'a>),
}

impl From<Scalar<'_>> for Value {
    fn from(scalar: Scalar<'_>) -> Value {
        match scalar {
            Scalar::Null => Value::Null,
            Scalar::Bool(b) => Value::Bool(b),
            Scalar::Str(s) => Value::String(s.into_owned()),
        }
    }
}

/// A scalar other than a number; `None` for anything else.
#[derive(Clone, Copy)]
struct ScalarItem<'s, 'w> {
    state: &'s State<'w>,
}

impl<'de> Expect<'de> for ScalarItem<'_, '_> {
    type Out = Option<Scalar<'de>>;

    fn other(self) -> Self::Out {
        None
    }

    fn null(self) -> Self::Out {
        Some(Scalar::Null)
    }

    fn boolean(self, value: bool) -> Self::Out {
        Some(Scalar::Bool(value))
    }

    fn string<E: de::Error>(self, text: Text<'de, '_>) -> Result<Self::Out, E> {
        self.state.text(text).map(|t| Some(Scalar::Str(t)))
    }
}

impl<'de> Expect<'de> for MountItem<'_, '_> {
    type Out = Mount<'de>;

    fn other(self) -> Self::Out {
        Mount::default()
    }

    // Read only where containers are not kept whole (a container kept whole holds its mounts).
    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Out, A::Error> {
        let state = self.state;
        let mut fields: [Option<(Str<'de>, Scalar<'de>)>; MOUNT_FIELDS] = Default::default();
        let mut count = 0;
        // Whether a field was not kept aside: the mount cannot be built whole from them.
        let mut partial = false;
        let mut path = None;
        while let Some(key) = map.next_key_seed(Key)? {
            let value = map.next_value_seed(Seed(ScalarItem { state }))?;
            if key.as_str() == "mountPath" {
                path = match &value {
                    Some(Scalar::Str(text)) => {
                        if let Cow::Owned(owned) = text {
                            state.budget.charge(cost::string(owned.len()))?;
                        }
                        Some(text.clone())
                    }
                    _ => None,
                };
            }
            match (value, fields.get_mut(count)) {
                (Some(value), Some(slot)) => {
                    let key = match key {
                        KeyText::Borrowed(key) => Cow::Borrowed(key),
                        KeyText::Owned(key) => {
                            state.budget.charge(cost::string(key.len()))?;
                            Cow::Owned(key)
                        }
                    };
                    *slot = Some((key, value));
                    count += 1;
                }
                _ => partial = true,
            }
        }
        let path = path.unwrap_or_default();
        if !state.wants(Named::Mount, &path) {
            return Ok(Mount { path, whole: None });
        }
        if partial {
            state.incomplete.set(true);
            return Ok(Mount { path, whole: None });
        }
        let whole = whole_mount(&state.budget, fields.into_iter().flatten()).ok_or_else(spent)?;
        Ok(Mount {
            path,
            whole: Some(Cow::Owned(whole)),
        })
    }
}

/// A mount built whole from the fields kept aside, within `budget`; `None` once it is spent.
fn whole_mount<'a, K: AsRef<str>>(
    budget: &Budget,
    fields: impl Iterator<Item = (K, Scalar<'a>)>,
) -> Option<Value> {
    let mut mount = Map::new();
    for (key, value) in fields {
        let key = key.as_ref();
        if !budget.spend(cost::MAP_FIRST_NODE + cost::MAP_ENTRY + cost::string(key.len())) {
            return None;
        }
        if let Scalar::Str(text) = &value
            && !budget.spend(cost::string(text.len()))
        {
            return None;
        }
        mount.insert(key.to_owned(), value.into());
    }
    Some(Value::Object(mount))
}

/// A volume.
#[derive(Clone, Copy)]
struct VolumeItem<'s, 'w> {
    state: &'s State<'w>,
}

impl<'de> Expect<'de> for VolumeItem<'_, '_> {
    type Out = Volume<'de>;

    fn other(self) -> Self::Out {
        Volume::default()
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Out, A::Error> {
        let state = self.state;
        let whole = |volume: Value| -> Result<Volume<'de>, A::Error> {
            let name = name_of(&volume).to_owned();
            state.budget.charge(cost::string(name.len()))?;
            Ok(Volume {
                name: Cow::Owned(name),
                holds_token: holds_service_account_token(&volume),
                whole: Some(Cow::Owned(volume)),
            })
        };
        if state.whole.is_none() {
            return whole(Value::Object(whole_object(state, Map::new(), map)?));
        }
        let mut volume = Volume::default();
        let mut first = true;
        while let Some(key) = map.next_key_seed(Key)? {
            let is_first = std::mem::replace(&mut first, false);
            match key.as_str() {
                "name" => {
                    let name = item_name(state, &mut map)?;
                    if state.wants(Named::Volume, &name) {
                        if is_first {
                            return whole(named_whole(state, &name, map)?);
                        }
                        state.incomplete.set(true);
                    }
                    volume.name = name;
                }
                "projected" => {
                    let projected = map.next_value_seed(Seed(Object(ProjectedFields)))?;
                    volume.holds_token = matches!(projected, Shape::Is(true));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(volume)
    }
}

/// Whether a projected volume's `sources` hold a `serviceAccountToken`.
struct ProjectedFields;

impl<'de> Fields<'de> for ProjectedFields {
    type Out = bool;

    fn field<A: MapAccess<'de>>(
        &self,
        key: &str,
        map: &mut A,
        out: &mut bool,
    ) -> Result<bool, A::Error> {
        if key != "sources" {
            return Ok(false);
        }
        *out = map.next_value_seed(Seed(TokenSources))?;
        Ok(true)
    }
}

/// Whether a list holds an object with a `serviceAccountToken` field.
struct TokenSources;

impl<'de> Expect<'de> for TokenSources {
    type Out = bool;

    fn other(self) -> bool {
        false
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let mut found = false;
        while let Some(holds) = seq.next_element_seed(Seed(Object(TokenSource)))? {
            found |= matches!(holds, Shape::Is(true));
        }
        Ok(found)
    }
}

/// Whether an object has a `serviceAccountToken` field.
struct TokenSource;

impl<'de> Fields<'de> for TokenSource {
    type Out = bool;

    fn field<A: MapAccess<'de>>(
        &self,
        key: &str,
        _map: &mut A,
        out: &mut bool,
    ) -> Result<bool, A::Error> {
        *out |= key == "serviceAccountToken";
        Ok(false)
    }
}

/// An object's key, borrowed from the JSON unless it has escapes: a skipped field's key is
/// never copied.
enum KeyText<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl KeyText<'_> {
    fn as_str(&self) -> &str {
        match self {
            KeyText::Borrowed(text) => text,
            KeyText::Owned(text) => text,
        }
    }

    fn into_owned(self) -> String {
        match self {
            KeyText::Borrowed(text) => text.to_owned(),
            KeyText::Owned(text) => text,
        }
    }
}

struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = KeyText<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<KeyText<'de>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = KeyText<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<KeyText<'de>, E> {
        Ok(KeyText::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyText<'de>, E> {
        Ok(KeyText::Owned(v.to_owned()))
    }
}

#[cfg(test)]
mod tests;
