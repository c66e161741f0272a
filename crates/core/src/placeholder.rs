//! `{{ pod.* }}` placeholders in a template's string values.
//!
//! A template's injected objects are parsed once, at compile time, into a [`Node`] tree in
//! which only strings holding placeholders stay dynamic. Rendering substitutes Pod metadata
//! into those strings and nowhere else: a placeholder can only ever produce a string value,
//! never structure, whatever the metadata holds.

use std::sync::OnceLock;

use serde_json::Value;

use crate::error::FieldError;
use crate::labels::Labels;

/// The placeholders a template may use, for error messages and docs.
pub const KNOWN_PLACEHOLDERS: &str = "pod.name, pod.namespace, pod.serviceAccountName, \
pod.labels['KEY'], pod.annotations['KEY']";

/// One piece of Pod metadata a placeholder refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Field {
    Name,
    Namespace,
    ServiceAccountName,
    Label(String),
    Annotation(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Field(Field),
}

/// A string with at least one placeholder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateString {
    segments: Vec<Segment>,
}

/// A piece of a [`TemplateString`]: literal text or one placeholder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part<'a> {
    /// Text used as it is.
    Literal(&'a str),
    /// `{{ pod.name }}`.
    Name,
    /// `{{ pod.namespace }}`.
    Namespace,
    /// `{{ pod.serviceAccountName }}`.
    ServiceAccountName,
    /// `{{ pod.labels['KEY'] }}`.
    Label(&'a str),
    /// `{{ pod.annotations['KEY'] }}`.
    Annotation(&'a str),
}

/// A label or an annotation, by key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MetadataKey {
    /// `metadata.labels[key]`.
    Label(String),
    /// `metadata.annotations[key]`.
    Annotation(String),
}

/// How much of a rendered string a Pod author controls, from least to most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reach {
    /// Nothing: no placeholder.
    Fixed,
    /// Values the API server constrains: the Pod's name, namespace and service account (DNS
    /// names) and label values (63 characters of `[A-Za-z0-9._-]`).
    Constrained,
    /// Anything: annotation values are free text.
    Annotations,
}

/// The Pod metadata placeholders draw from.
#[derive(Clone, Copy)]
pub struct PodFacts<'a> {
    /// `metadata.name`, or `metadata.generateName` when the name is not yet set.
    pub name: &'a str,
    /// The namespace the Pod is created in.
    pub namespace: &'a str,
    /// `spec.serviceAccountName`, `default` when unset.
    pub service_account_name: &'a str,
    /// `metadata.labels`.
    pub labels: Option<&'a dyn Labels>,
    /// `metadata.annotations`.
    pub annotations: Option<&'a dyn Labels>,
}

impl std::fmt::Debug for PodFacts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodFacts")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("service_account_name", &self.service_account_name)
            .finish_non_exhaustive()
    }
}

impl TemplateString {
    /// Parses `text`: `Ok(None)` when it holds no placeholder, an error naming the problem when
    /// a placeholder is unterminated or unknown.
    pub fn parse(text: &str) -> Result<Option<Self>, String> {
        if !text.contains("{{") {
            return Ok(None);
        }
        let mut segments = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find("{{") {
            if start > 0 {
                segments.push(Segment::Literal(rest[..start].to_owned()));
            }
            let after_open = &rest[start + 2..];
            let Some(end) = after_open.find("}}") else {
                return Err(format!(
                    "unterminated placeholder {:?}: expected }}}}",
                    &rest[start..]
                ));
            };
            let expression = after_open[..end].trim();
            segments.push(Segment::Field(parse_field(expression).ok_or_else(
                || {
                    format!(
                        "unknown placeholder {{{{ {expression} }}}}; known: {KNOWN_PLACEHOLDERS}"
                    )
                },
            )?));
            rest = &after_open[end + 2..];
        }
        if !rest.is_empty() {
            segments.push(Segment::Literal(rest.to_owned()));
        }
        Ok(Some(Self { segments }))
    }

    /// The most a Pod author can choose of what this string renders to.
    pub fn reach(&self) -> Reach {
        self.segments
            .iter()
            .map(|segment| match segment {
                Segment::Literal(_) => Reach::Fixed,
                Segment::Field(Field::Annotation(_)) => Reach::Annotations,
                Segment::Field(_) => Reach::Constrained,
            })
            .max()
            .unwrap_or(Reach::Fixed)
    }

    /// Its literal text and placeholders, in order (the policy compiler writes them as CEL).
    pub fn parts(&self) -> impl Iterator<Item = Part<'_>> {
        self.segments.iter().map(|segment| match segment {
            Segment::Literal(text) => Part::Literal(text),
            Segment::Field(Field::Name) => Part::Name,
            Segment::Field(Field::Namespace) => Part::Namespace,
            Segment::Field(Field::ServiceAccountName) => Part::ServiceAccountName,
            Segment::Field(Field::Label(key)) => Part::Label(key),
            Segment::Field(Field::Annotation(key)) => Part::Annotation(key),
        })
    }

    /// The labels and annotations it reads (which templates may add to the Pod).
    pub fn metadata_reads(&self) -> impl Iterator<Item = MetadataKey> + '_ {
        self.segments.iter().filter_map(|s| match s {
            Segment::Field(Field::Label(key)) => Some(MetadataKey::Label(key.clone())),
            Segment::Field(Field::Annotation(key)) => Some(MetadataKey::Annotation(key.clone())),
            _ => None,
        })
    }

    /// The label or annotation key it reads that starts with `prefix`, if any.
    pub fn reads_key_with_prefix(&self, prefix: &str) -> Option<&str> {
        self.segments.iter().find_map(|s| match s {
            Segment::Field(Field::Label(key)) | Segment::Field(Field::Annotation(key))
                if key.starts_with(prefix) =>
            {
                Some(key.as_str())
            }
            _ => None,
        })
    }

    /// The string with every placeholder replaced; a missing label or annotation is empty.
    pub fn render(&self, pod: &PodFacts<'_>) -> String {
        // Sized first: rendered on every admission, grown piece by piece it was copied over.
        let len = self.segments.iter().map(|s| s.rendered(pod).len()).sum();
        let mut out = String::with_capacity(len);
        for segment in &self.segments {
            out.push_str(segment.rendered(pod));
        }
        out
    }
}

impl Segment {
    /// The text it stands for in `pod`.
    fn rendered<'a>(&'a self, pod: &PodFacts<'a>) -> &'a str {
        match self {
            Segment::Literal(text) => text,
            Segment::Field(Field::Name) => pod.name,
            Segment::Field(Field::Namespace) => pod.namespace,
            Segment::Field(Field::ServiceAccountName) => pod.service_account_name,
            Segment::Field(Field::Label(key)) => lookup(pod.labels, key),
            Segment::Field(Field::Annotation(key)) => lookup(pod.annotations, key),
        }
    }
}

fn lookup<'a>(map: Option<&'a dyn Labels>, key: &str) -> &'a str {
    map.and_then(|m| m.label(key)).unwrap_or_default()
}

fn parse_field(expression: &str) -> Option<Field> {
    match expression {
        "pod.name" => return Some(Field::Name),
        "pod.namespace" => return Some(Field::Namespace),
        "pod.serviceAccountName" => return Some(Field::ServiceAccountName),
        _ => {}
    }
    let (map, index) = expression.split_once('[')?;
    let key = index.strip_suffix(']')?.trim();
    let key = key
        .strip_prefix('\'')
        .and_then(|k| k.strip_suffix('\''))
        .or_else(|| key.strip_prefix('"').and_then(|k| k.strip_suffix('"')))?;
    if key.is_empty() {
        return None;
    }
    match map.trim_end() {
        "pod.labels" => Some(Field::Label(key.to_owned())),
        "pod.annotations" => Some(Field::Annotation(key.to_owned())),
        _ => None,
    }
}

/// JSON text written once, when a template is compiled, with its base64 made the first time a
/// patch needs it for each of the three ways the text can fall against base64's 3-byte groups.
#[derive(Clone, Debug, Default)]
pub struct JsonText {
    json: Box<str>,
    base64: [OnceLock<Box<str>>; 3],
}

impl JsonText {
    fn new(json: String) -> Self {
        JsonText {
            json: json.into_boxed_str(),
            base64: Default::default(),
        }
    }

    /// The JSON.
    pub fn get(&self) -> &str {
        &self.json
    }

    /// The base64 of the JSON's bytes from `skip` (0, 1 or 2) on, as far as they make whole
    /// groups of 3: a patch encoded as base64 copies it wherever this text starts `skip` bytes
    /// before a group boundary (see [`crate::patch::Base64Out`]). Made once per `skip`, the
    /// first time it is asked for; `None` for `skip` past 2.
    pub fn base64_from(&self, skip: usize) -> Option<&str> {
        let slot = self.base64.get(skip)?;
        Some(slot.get_or_init(|| {
            use base64::Engine as _;
            let tail = self.json.as_bytes().get(skip..).unwrap_or_default();
            let whole = tail.len() / 3 * 3;
            BASE64.encode(&tail[..whole]).into_boxed_str()
        }))
    }
}

/// A subtree of a template without placeholders, and its JSON, written once when the template
/// is compiled: a patch copies it as it is instead of serializing it again for every Pod.
#[derive(Clone, Debug)]
pub struct Fixed {
    value: Value,
    json: JsonText,
    children: OnceLock<Children>,
}

/// The fields of an object, or the items of an array, each a [`Fixed`] of its own.
#[derive(Clone, Debug)]
enum Children {
    Fields(Vec<(String, Fixed)>),
    Items(Vec<Fixed>),
    None,
}

impl Fixed {
    /// `value`, written as JSON.
    pub fn new(value: Value) -> Self {
        // Writing a `Value` cannot fail: its keys are strings.
        let json = serde_json::to_string(&value).unwrap_or_else(|_| "null".to_owned());
        Fixed {
            value,
            json: JsonText::new(json),
            children: OnceLock::new(),
        }
    }

    /// The value.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The value as compact JSON, as `serde_json` writes it.
    pub fn json(&self) -> &JsonText {
        &self.json
    }

    /// An object's fields, each with its JSON, in the order `serde_json` writes them; `None`
    /// for any other value. Made the first time they are asked for: a patch that extends a
    /// template's container for one Pod (its token's mount) still copies each part's JSON.
    pub fn fields(&self) -> Option<&[(String, Fixed)]> {
        match self.children() {
            Children::Fields(fields) => Some(fields),
            _ => None,
        }
    }

    /// An array's items, each with its JSON (as [`Fixed::fields`]); `None` for any other value.
    pub fn items(&self) -> Option<&[Fixed]> {
        match self.children() {
            Children::Items(items) => Some(items),
            _ => None,
        }
    }

    fn children(&self) -> &Children {
        self.children.get_or_init(|| match &self.value {
            Value::Object(fields) => Children::Fields(
                fields
                    .iter()
                    .map(|(key, value)| (key.clone(), Fixed::new(value.clone())))
                    .collect(),
            ),
            Value::Array(items) => Children::Items(items.iter().cloned().map(Fixed::new).collect()),
            _ => Children::None,
        })
    }
}

impl PartialEq for Fixed {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

/// The items of an array or an object with placeholders somewhere inside, and the JSON of the
/// whole as a layout ([`Node::layout`]), made the first time a patch writes it.
#[derive(Clone, Debug)]
pub struct Parts<T> {
    items: Vec<T>,
    layout: OnceLock<Vec<Piece>>,
}

impl<T> Parts<T> {
    /// The parts `items`.
    pub fn new(items: Vec<T>) -> Self {
        Parts {
            items,
            layout: OnceLock::new(),
        }
    }
}

impl<T> std::ops::Deref for Parts<T> {
    type Target = Vec<T>;

    fn deref(&self) -> &Vec<T> {
        &self.items
    }
}

impl<'p, T> IntoIterator for &'p Parts<T> {
    type Item = &'p T;
    type IntoIter = std::slice::Iter<'p, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

impl<T: PartialEq> PartialEq for Parts<T> {
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items
    }
}

/// A piece of a [`Node`]'s JSON: written once, or the next string with placeholders.
#[derive(Clone, Debug)]
pub enum Piece {
    /// JSON text the same for every Pod.
    Json(JsonText),
    /// The next string with placeholders (in the order of [`Node::render_texts`]), rendered
    /// for the Pod.
    Text,
}

/// A JSON value whose strings may hold placeholders.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// A subtree without placeholders, copied as it is.
    Fixed(Fixed),
    /// A string with placeholders.
    Text(TemplateString),
    /// An array with placeholders somewhere inside.
    Array(Parts<Node>),
    /// An object with placeholders somewhere inside (keys are never templated).
    Object(Parts<(String, Node)>),
}

impl Node {
    /// Parses every string in `value`; problems are reported against `path`.
    pub fn parse(value: &Value, path: &str, errors: &mut Vec<FieldError>) -> Node {
        match value {
            Value::String(text) => match TemplateString::parse(text) {
                Ok(Some(template)) => Node::Text(template),
                Ok(None) => Node::Fixed(Fixed::new(value.clone())),
                Err(message) => {
                    errors.push(FieldError::new(path, message));
                    Node::Fixed(Fixed::new(value.clone()))
                }
            },
            Value::Array(items) => {
                let nodes: Vec<Node> = items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| Node::parse(item, &format!("{path}[{i}]"), errors))
                    .collect();
                if nodes.iter().all(|n| matches!(n, Node::Fixed(_))) {
                    Node::Fixed(Fixed::new(value.clone()))
                } else {
                    Node::Array(Parts::new(nodes))
                }
            }
            Value::Object(fields) => {
                let nodes: Vec<(String, Node)> = fields
                    .iter()
                    .map(|(k, v)| (k.clone(), Node::parse(v, &format!("{path}.{k}"), errors)))
                    .collect();
                if nodes.iter().all(|(_, n)| matches!(n, Node::Fixed(_))) {
                    Node::Fixed(Fixed::new(value.clone()))
                } else {
                    Node::Object(Parts::new(nodes))
                }
            }
            _ => Node::Fixed(Fixed::new(value.clone())),
        }
    }

    /// The value with Pod metadata substituted.
    pub fn render(&self, pod: &PodFacts<'_>) -> Value {
        match self {
            Node::Fixed(fixed) => fixed.value.clone(),
            Node::Text(template) => Value::String(template.render(pod)),
            Node::Array(items) => Value::Array(items.iter().map(|n| n.render(pod)).collect()),
            Node::Object(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(k, n)| (k.clone(), n.render(pod)))
                    .collect(),
            ),
        }
    }

    /// Renders every string with placeholders below this node, depth first, in the order the
    /// node's JSON holds them.
    pub fn render_texts(&self, pod: &PodFacts<'_>, texts: &mut Vec<String>) {
        match self {
            Node::Fixed(_) => {}
            Node::Text(template) => texts.push(template.render(pod)),
            Node::Array(items) => items.iter().for_each(|n| n.render_texts(pod, texts)),
            Node::Object(fields) => fields.iter().for_each(|(_, n)| n.render_texts(pod, texts)),
        }
    }

    /// How many strings with placeholders the node holds: its share of
    /// [`Node::render_texts`], in that order.
    pub fn text_count(&self) -> usize {
        match self {
            Node::Fixed(_) => 0,
            Node::Text(_) => 1,
            Node::Array(items) => items.iter().map(Node::text_count).sum(),
            Node::Object(fields) => fields.iter().map(|(_, n)| n.text_count()).sum(),
        }
    }

    /// The node's JSON as a layout: the text between its strings with placeholders written
    /// once, as `serde_json` writes it, and a [`Piece::Text`] for each such string. Made the
    /// first time it is asked for.
    pub fn layout(&self) -> std::borrow::Cow<'_, [Piece]> {
        use std::borrow::Cow;
        match self {
            Node::Array(Parts { layout, .. }) | Node::Object(Parts { layout, .. }) => {
                Cow::Borrowed(layout.get_or_init(|| self.build_layout()))
            }
            Node::Fixed(_) | Node::Text(_) => Cow::Owned(self.build_layout()),
        }
    }

    fn build_layout(&self) -> Vec<Piece> {
        let mut segments = Vec::new();
        let mut json = String::new();
        self.lay_out(&mut json, &mut segments);
        if !json.is_empty() {
            segments.push(Piece::Json(JsonText::new(json)));
        }
        segments
    }

    fn lay_out(&self, json: &mut String, segments: &mut Vec<Piece>) {
        match self {
            Node::Fixed(fixed) => json.push_str(fixed.json.get()),
            Node::Text(_) => {
                if !json.is_empty() {
                    segments.push(Piece::Json(JsonText::new(std::mem::take(json))));
                }
                segments.push(Piece::Text);
            }
            Node::Array(items) => {
                json.push('[');
                for (at, item) in items.iter().enumerate() {
                    if at > 0 {
                        json.push(',');
                    }
                    item.lay_out(json, segments);
                }
                json.push(']');
            }
            Node::Object(fields) => {
                json.push('{');
                for (at, (key, value)) in fields.iter().enumerate() {
                    if at > 0 {
                        json.push(',');
                    }
                    json.push_str(&serde_json::to_string(key).unwrap_or_default());
                    json.push(':');
                    value.lay_out(json, segments);
                }
                json.push('}');
            }
        }
    }

    /// Calls `visit` with every string holding placeholders and its path below this node
    /// (`args[1]`, `env[0].value`, …).
    pub fn visit_templated(&self, visit: &mut impl FnMut(&[PathStep<'_>], &TemplateString)) {
        fn walk<'n>(
            node: &'n Node,
            path: &mut Vec<PathStep<'n>>,
            visit: &mut impl FnMut(&[PathStep<'_>], &TemplateString),
        ) {
            match node {
                Node::Fixed(_) => {}
                Node::Text(template) => visit(path, template),
                Node::Array(items) => {
                    for (index, item) in items.iter().enumerate() {
                        path.push(PathStep::Index(index));
                        walk(item, path, visit);
                        path.pop();
                    }
                }
                Node::Object(fields) => {
                    for (key, value) in fields {
                        path.push(PathStep::Key(key));
                        walk(value, path, visit);
                        path.pop();
                    }
                }
            }
        }
        walk(self, &mut Vec::new(), visit);
    }
}

/// One step of a path into a [`Node`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathStep<'n> {
    /// An object's field.
    Key(&'n str),
    /// An array's item.
    Index(usize),
}

/// `base` followed by `steps`, as the field paths of validation errors write it.
pub fn field_path(base: &str, steps: &[PathStep<'_>]) -> String {
    let mut out = base.to_owned();
    for step in steps {
        match step {
            PathStep::Key(key) => {
                out.push('.');
                out.push_str(key);
            }
            PathStep::Index(index) => out.push_str(&format!("[{index}]")),
        }
    }
    out
}

/// Standard padded base64, as an AdmissionResponse carries a patch: AVX2 where the CPU has it
/// (looked up once), NEON on aarch64, plain code elsewhere.
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "aarch64", target_feature = "neon")
))]
pub(crate) static BASE64: std::sync::LazyLock<base64::engine::Simd> =
    std::sync::LazyLock::new(|| {
        base64::engine::Simd::standard(base64::engine::general_purpose::PAD)
    });
#[cfg(not(any(
    target_arch = "x86_64",
    all(target_arch = "aarch64", target_feature = "neon")
)))]
pub(crate) static BASE64: base64::engine::GeneralPurpose =
    base64::engine::general_purpose::STANDARD;

#[cfg(test)]
mod tests;
