//! The Pod decoded by plain functions over the pull reader ([`crate::json_pull`]): the same
//! [`Pod`] as the `serde` decoder above builds, charged the same, without `serde`'s visitors
//! between the text and what is built. Only for Pods as the API server writes them: where a
//! field read holds another type than a Pod's, an item kept whole names itself after its other
//! fields, a key read has an escape or the allowance runs out, it refuses, and the caller
//! decodes the Pod with [`decode_pod_among`](super::decode_pod_among), which gives the error or
//! the Pod; so a Pod this accepts decodes the same both ways (the tests compare them).

use std::borrow::Cow;
use std::mem::size_of;

use serde_json::{Map, Value};

use super::{
    Decoded, MOUNT_FIELDS, Named, RawMetadata, RawPod, RawSpec, Scalar, Shape, State, adds,
    assemble, cost, whole_mount,
};
use crate::json_pull::{Integer, Reader, Refused, Result};
use crate::plan::KnownTemplates;
use crate::pod::{
    Container, EnvVar, Mount, Pod, Str, Strings, Volume, holds_service_account_token, name_of,
};

/// Decodes the Pod that comes next in `reader` as [`decode_pod_among`](super::decode_pod_among)
/// decodes it on its own, within `allowance` bytes, among `known`: every template in force.
pub fn pull_pod_among<'j>(
    reader: &mut Reader<'j>,
    allowance: usize,
    known: &(impl KnownTemplates + ?Sized),
) -> Result<Pod<'j>> {
    let whole = |named: Named, name: &str| adds(known, named, name);
    pull(reader, allowance, &whole).map(|decoded| decoded.pod)
}

/// Decodes the Pod that comes next in `reader` within `allowance` bytes, keeping whole the
/// named items `whole` says.
fn pull<'j>(
    reader: &mut Reader<'j>,
    allowance: usize,
    whole: &dyn Fn(Named, &str) -> bool,
) -> Result<Decoded<'j>> {
    let state = State::new(allowance, Some(whole));
    let pod = Pulling { state: &state }.pod(reader)?;
    Ok(Decoded {
        pod,
        charged: allowance - state.budget.left.get(),
    })
}

/// One decoding's state, and the functions that decode each part of a Pod with it.
#[derive(Clone, Copy)]
struct Pulling<'s, 'w> {
    state: &'s State<'w>,
}

impl<'w> Pulling<'_, 'w> {
    fn charge(self, bytes: usize) -> Result<()> {
        if self.state.budget.spend(bytes) {
            Ok(())
        } else {
            Err(Refused)
        }
    }

    /// Charges the `Vec` an item of `size` bytes is pushed to.
    fn charge_item(self, size: usize, first: bool) -> Result<()> {
        self.charge(cost::item(size, first))
    }

    /// Whether a `named` item called `name` is kept whole.
    fn wants(self, named: Named, name: &str) -> bool {
        self.state.wants(named, name)
    }

    fn pod<'j>(self, reader: &mut Reader<'j>) -> Result<Pod<'j>> {
        let mut pod = RawPod::default();
        reader.object()?;
        let mut first = true;
        while let Some(key) = reader.key(&mut first)? {
            match key {
                "metadata" => pod.metadata = self.nullable(reader, Self::metadata)?.into(),
                "spec" => pod.spec = self.nullable(reader, Self::spec)?.into(),
                _ => reader.skip()?,
            }
        }
        // A Pod the planner cannot plan is left to the `serde` decoder, for its error.
        assemble(Shape::Is(pod)).map_err(|_| Refused)
    }

    /// `None` for `null`, else what `read` reads.
    fn nullable<'j, T>(
        self,
        reader: &mut Reader<'j>,
        read: impl FnOnce(Self, &mut Reader<'j>) -> Result<T>,
    ) -> Result<Option<T>> {
        if reader.null()? {
            return Ok(None);
        }
        read(self, reader).map(Some)
    }

    fn metadata<'j>(self, reader: &mut Reader<'j>) -> Result<RawMetadata<'j>> {
        let mut metadata = RawMetadata::default();
        reader.object()?;
        let mut first = true;
        while let Some(key) = reader.key(&mut first)? {
            match key {
                "name" => metadata.name = self.non_empty(reader)?,
                "generateName" => metadata.generate_name = self.non_empty(reader)?,
                "namespace" => metadata.namespace = self.non_empty(reader)?,
                "labels" => metadata.labels = self.nullable(reader, Self::strings)?.into(),
                "annotations" => {
                    metadata.annotations = self.nullable(reader, Self::strings)?.into()
                }
                _ => reader.skip()?,
            }
        }
        Ok(metadata)
    }

    fn spec<'j>(self, reader: &mut Reader<'j>) -> Result<RawSpec<'j>> {
        let mut spec = RawSpec::default();
        reader.object()?;
        let mut first = true;
        let containers = size_of::<Option<Container<'j>>>();
        while let Some(key) = reader.key(&mut first)? {
            match key {
                "containers" => {
                    spec.containers = self.list(reader, containers, Self::container)?.into()
                }
                "initContainers" => {
                    spec.init_containers = self.list(reader, containers, Self::container)?.into()
                }
                "volumes" => {
                    spec.volumes = self
                        .list(reader, size_of::<Volume<'j>>(), Self::volume)?
                        .into()
                }
                "imagePullSecrets" => {
                    spec.image_pull_secrets = self
                        .list(reader, size_of::<Str<'j>>(), Self::name_of_object)?
                        .into()
                }
                "hostNetwork" => spec.host_network = !reader.null()? && reader.boolean()?,
                "automountServiceAccountToken" => {
                    spec.token_automount_off = !reader.null()? && !reader.boolean()?
                }
                "serviceAccountName" => spec.service_account_name = self.non_empty(reader)?,
                "serviceAccount" => spec.service_account = self.non_empty(reader)?,
                _ => reader.skip()?,
            }
        }
        Ok(spec)
    }

    /// A string or `null`, unescaped within the allowance.
    fn text<'j>(self, reader: &mut Reader<'j>) -> Result<Option<Str<'j>>> {
        let Some(text) = reader.string_or_null()? else {
            return Ok(None);
        };
        if let Cow::Owned(owned) = &text {
            // `serde_json` unescapes into its scratch buffer, which grows by doubling.
            self.charge(cost::string(owned.len()) + 2 * owned.len())?;
        }
        Ok(Some(text))
    }

    /// A string, `None` when empty or `null`.
    fn non_empty<'j>(self, reader: &mut Reader<'j>) -> Result<Option<Str<'j>>> {
        Ok(self.text(reader)?.filter(|text| !text.is_empty()))
    }

    /// The value of a `name` field: a string, empty for `null`.
    fn item_name<'j>(self, reader: &mut Reader<'j>) -> Result<Str<'j>> {
        Ok(self.text(reader)?.unwrap_or_default())
    }

    /// Labels or annotations: an object of strings (or `null`s).
    fn strings<'j>(self, reader: &mut Reader<'j>) -> Result<Strings<'j>> {
        let entry = size_of::<(Str<'j>, Option<Str<'j>>)>();
        let mut entries = Vec::new();
        reader.object()?;
        let mut first = true;
        while let Some(key) = reader.key(&mut first)? {
            self.charge_item(entry, entries.is_empty())?;
            self.charge(cost::sort(entry))?;
            let value = self.text(reader)?;
            entries.push((Cow::Borrowed(key), value));
        }
        Ok(Strings::from_entries(entries))
    }

    /// A list, `None` for `null`, its items read by `item`, each charged as `size` bytes.
    fn list<'j, T>(
        self,
        reader: &mut Reader<'j>,
        size: usize,
        item: impl Fn(Self, &mut Reader<'j>) -> Result<T>,
    ) -> Result<Option<Vec<T>>> {
        if reader.null()? {
            return Ok(None);
        }
        reader.array()?;
        let mut items = Vec::new();
        let mut first = true;
        loop {
            // Charged before each item is looked for, the end included, as the `serde`
            // decoder charges.
            self.charge_item(size, items.is_empty())?;
            if !reader.item(&mut first)? {
                return Ok(Some(items));
            }
            items.push(item(self, reader)?);
        }
    }

    /// A container; `Some`, as the `serde` decoder gives one.
    fn container<'j>(self, reader: &mut Reader<'j>) -> Result<Option<Container<'j>>> {
        let mut container = Container::default();
        reader.object()?;
        let mut first = true;
        loop {
            let is_first = first;
            let Some(key) = reader.key(&mut first)? else {
                break;
            };
            match key {
                "name" => {
                    let name = self.item_name(reader)?;
                    let named = Named::Container;
                    if let Some(whole) = self.whole_if_wanted(reader, named, &name, is_first)? {
                        return Ok(Some(Container::of_owned(whole)));
                    }
                    container.name = name;
                }
                "env" => container.env = self.list(reader, size_of::<EnvVar<'j>>(), Self::env)?,
                "envFrom" if self.wants(Named::EnvFrom, "") => {
                    let env_from = self.whole_value(reader)?;
                    container.env_from = env_from.is_array().then_some(Cow::Owned(env_from));
                }
                "envFrom" => {
                    // Planning reads only whether there is a list: an empty one stands for it.
                    let is_list = !reader.null()?;
                    if is_list {
                        reader.array()?;
                        let mut first_item = true;
                        while reader.item(&mut first_item)? {
                            reader.skip()?;
                        }
                    }
                    container.env_from = is_list.then_some(Cow::Owned(Value::Array(Vec::new())));
                }
                "volumeMounts" => {
                    container.volume_mounts =
                        self.list(reader, size_of::<Mount<'j>>(), Self::mount)?
                }
                "restartPolicy" => {
                    container.native_sidecar = self.text(reader)?.as_deref() == Some("Always")
                }
                _ => reader.skip()?,
            }
        }
        Ok(Some(container))
    }

    fn env<'j>(self, reader: &mut Reader<'j>) -> Result<EnvVar<'j>> {
        let mut name = Cow::Borrowed("");
        reader.object()?;
        let mut first = true;
        loop {
            let is_first = first;
            let Some(key) = reader.key(&mut first)? else {
                break;
            };
            if key != "name" {
                reader.skip()?;
                continue;
            }
            name = self.item_name(reader)?;
            if let Some(whole) = self.whole_if_wanted(reader, Named::Env, &name, is_first)? {
                return Ok(EnvVar {
                    name: Cow::Owned(name_of(&whole).to_owned()),
                    whole: Some(Cow::Owned(whole)),
                });
            }
        }
        Ok(EnvVar { name, whole: None })
    }

    /// A volume mount: its fields (strings and booleans) kept aside until its path is known,
    /// then built whole when a template mounts a volume there.
    fn mount<'j>(self, reader: &mut Reader<'j>) -> Result<Mount<'j>> {
        let mut fields: [Option<(&'j str, Scalar<'j>)>; MOUNT_FIELDS] = Default::default();
        let mut count = 0;
        // Whether a field was not kept aside: the mount cannot be built whole from them.
        let mut partial = false;
        let mut path = None;
        reader.object()?;
        let mut first = true;
        while let Some(key) = reader.key(&mut first)? {
            let value = match reader.peek()? {
                b'"' => self.text(reader)?.map(Scalar::Str),
                b't' | b'f' => Some(Scalar::Bool(reader.boolean()?)),
                b'n' => reader.null().map(|_| Some(Scalar::Null))?,
                // Read, as `serde_json` reads it, but not kept.
                _ => reader.integer().map(|_| None)?,
            };
            if key == "mountPath" {
                path = match &value {
                    Some(Scalar::Str(text)) => {
                        if let Cow::Owned(owned) = text {
                            self.charge(cost::string(owned.len()))?;
                        }
                        Some(text.clone())
                    }
                    _ => None,
                };
            }
            match (value, fields.get_mut(count)) {
                (Some(value), Some(slot)) => {
                    *slot = Some((key, value));
                    count += 1;
                }
                _ => partial = true,
            }
        }
        let path = path.unwrap_or_default();
        if !self.wants(Named::Mount, &path) {
            return Ok(Mount { path, whole: None });
        }
        if partial {
            return Err(Refused);
        }
        let whole = whole_mount(&self.state.budget, fields.into_iter().flatten()).ok_or(Refused)?;
        Ok(Mount {
            path,
            whole: Some(Cow::Owned(whole)),
        })
    }

    fn volume<'j>(self, reader: &mut Reader<'j>) -> Result<Volume<'j>> {
        let mut volume = Volume::default();
        reader.object()?;
        let mut first = true;
        loop {
            let is_first = first;
            let Some(key) = reader.key(&mut first)? else {
                break;
            };
            match key {
                "name" => {
                    let name = self.item_name(reader)?;
                    let named = Named::Volume;
                    if let Some(whole) = self.whole_if_wanted(reader, named, &name, is_first)? {
                        return Ok(Volume {
                            name: Cow::Owned(name_of(&whole).to_owned()),
                            holds_token: holds_service_account_token(&whole),
                            whole: Some(Cow::Owned(whole)),
                        });
                    }
                    volume.name = name;
                }
                "projected" => {
                    volume.holds_token = self
                        .nullable(reader, |_, reader| projected_holds_token(reader))?
                        == Some(true)
                }
                _ => reader.skip()?,
            }
        }
        Ok(volume)
    }

    /// The `name` of an object (empty without one), or empty for `null`.
    fn name_of_object<'j>(self, reader: &mut Reader<'j>) -> Result<Str<'j>> {
        let mut name = Cow::Borrowed("");
        if reader.null()? {
            return Ok(name);
        }
        reader.object()?;
        let mut first = true;
        while let Some(key) = reader.key(&mut first)? {
            if key == "name" {
                name = self.item_name(reader)?;
            } else {
                reader.skip()?;
            }
        }
        Ok(name)
    }

    /// The rest of the open item, whole, when a `named` item called `name` (its `name` just
    /// read) is kept whole. Only when `name` was its first key: else it is refused, and the
    /// `serde` decoder decodes the Pod again whole.
    #[inline]
    fn whole_if_wanted(
        self,
        reader: &mut Reader<'_>,
        named: Named,
        name: &str,
        is_first: bool,
    ) -> Result<Option<Value>> {
        if !self.wants(named, name) {
            return Ok(None);
        }
        if !is_first {
            return Err(Refused);
        }
        self.named_whole(reader, name).map(Some)
    }

    /// An object whose first field is `name` (already read), the rest read whole; charged for
    /// the copy of its name the item takes as well.
    #[cold]
    fn named_whole(self, reader: &mut Reader<'_>, name: &str) -> Result<Value> {
        self.charge(
            cost::MAP_FIRST_NODE + cost::MAP_ENTRY + cost::string(4) + cost::string(name.len()),
        )?;
        let mut object = Map::new();
        object.insert("name".to_owned(), Value::String(name.to_owned()));
        let whole = self.whole_entries(reader, object).map(Value::Object)?;
        self.charge(cost::string(name_of(&whole).len()))?;
        Ok(whole)
    }

    /// The rest of the open object, whole, after the entries already in `object`.
    fn whole_entries(
        self,
        reader: &mut Reader<'_>,
        mut object: Map<String, Value>,
    ) -> Result<Map<String, Value>> {
        let mut first = object.is_empty();
        while let Some(key) = reader.key(&mut first)? {
            let first_node = if object.is_empty() {
                cost::MAP_FIRST_NODE
            } else {
                0
            };
            self.charge(first_node + cost::MAP_ENTRY + cost::string(key.len()))?;
            let value = self.whole_value(reader)?;
            object.insert(key.to_owned(), value);
        }
        Ok(object)
    }

    /// The value that comes next, built whole within the allowance.
    fn whole_value(self, reader: &mut Reader<'_>) -> Result<Value> {
        match reader.peek()? {
            b'"' => {
                let text = reader.string()?;
                let escaped = matches!(text, Cow::Owned(_));
                // Unescaped, `serde_json`'s scratch buffer grows by doubling.
                let scratch = if escaped { 2 * text.len() } else { 0 };
                self.charge(cost::string(text.len()) + scratch)?;
                Ok(Value::String(text.into_owned()))
            }
            b'{' => {
                reader.object()?;
                self.whole_entries(reader, Map::new()).map(Value::Object)
            }
            b'[' => {
                reader.array()?;
                let mut items = Vec::new();
                let mut first = true;
                loop {
                    self.charge(if items.is_empty() {
                        cost::LIST_FIRST_ITEM
                    } else {
                        cost::LIST_ITEM
                    })?;
                    if !reader.item(&mut first)? {
                        return Ok(Value::Array(items));
                    }
                    items.push(self.whole_value(reader)?);
                }
            }
            b't' | b'f' => reader.boolean().map(Value::Bool),
            b'n' => {
                reader.null()?;
                Ok(Value::Null)
            }
            _ => match reader.integer() {
                Ok(Integer::Unsigned(n)) => Ok(Value::from(n)),
                Ok(Integer::Negative(n)) => Ok(Value::from(n)),
                // A float (or `-0`, or an integer beyond 64 bits) read by `serde_json` from its
                // own text, as it reads it in the Pod's.
                Err(Refused) => serde_json::from_str(reader.raw()?).map_err(|_| Refused),
            },
        }
    }
}

/// Whether a projected volume's `sources` hold a `serviceAccountToken`.
fn projected_holds_token(reader: &mut Reader<'_>) -> Result<bool> {
    let mut holds = false;
    reader.object()?;
    let mut first = true;
    while let Some(key) = reader.key(&mut first)? {
        if key != "sources" {
            reader.skip()?;
            continue;
        }
        holds = false;
        if reader.null()? {
            continue;
        }
        reader.array()?;
        let mut first_source = true;
        while reader.item(&mut first_source)? {
            if reader.null()? {
                continue;
            }
            reader.object()?;
            let mut first_key = true;
            while let Some(key) = reader.key(&mut first_key)? {
                holds |= key == "serviceAccountToken";
                reader.skip()?;
            }
        }
    }
    Ok(holds)
}

#[cfg(test)]
#[path = "pulled/tests.rs"]
mod tests;
