//! The JSON patch a plan produces, with values borrowed from the compiled templates.
//!
//! The webhook writes the patch once and throws it away, so copying every injected container
//! into an owned `serde_json::Value` first would be wasted work (it was most of the cost of
//! planning a typical Pod). Fixed parts of a template are borrowed; an array or object with
//! placeholders is the template's node and its rendered strings ([`PatchValue::Rendered`]); an
//! injected container given the token's mount is its fields' own fixed parts and strings
//! ([`PatchValue::Object`]), so its long fixed fields are still copied.
//! [`Patch::write_json`] writes the patch by hand, copying the JSON written when the template
//! was compiled (the same bytes as `serde_json` gives); [`Patch::write_base64`] writes its
//! base64, as an AdmissionResponse carries it, copying also the base64 of each long fixed text,
//! made once. [`Patch::to_json_patch`] gives an owned `json_patch::Patch` where one is needed
//! (to apply it in `render` and in tests).

use json_patch::jsonptr::PointerBuf;
use serde::ser::{SerializeMap, SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::placeholder::{BASE64, Fixed, JsonText, Node, Piece, PodFacts};

/// A JSON value in a patch.
#[derive(Clone, Debug, PartialEq)]
pub enum PatchValue<'t> {
    /// A fixed part of a template.
    Fixed(&'t Fixed),
    /// A value made for this Pod.
    Owned(Value),
    /// A string with Pod metadata substituted.
    String(String),
    /// An array with something made for this Pod inside.
    Array(Vec<PatchValue<'t>>),
    /// An object with something made for this Pod inside.
    Object(Vec<(&'t str, PatchValue<'t>)>),
    /// An array or an object of a template with its strings with placeholders rendered for
    /// this Pod, in the order `Node::render_texts` gives them.
    Rendered(&'t Node, Vec<String>),
}

impl<'t> PatchValue<'t> {
    /// `node` with Pod metadata substituted, borrowing every fixed part: of an array or an
    /// object, the node itself and its strings with placeholders, rendered.
    pub fn render(node: &'t Node, pod: &PodFacts<'_>) -> Self {
        match node {
            Node::Fixed(fixed) => PatchValue::Fixed(fixed),
            Node::Text(template) => PatchValue::String(template.render(pod)),
            Node::Array(_) | Node::Object(_) => {
                let mut texts = Vec::new();
                node.render_texts(pod, &mut texts);
                PatchValue::Rendered(node, texts)
            }
        }
    }
}

impl PatchValue<'_> {
    /// An owned copy.
    pub fn to_value(&self) -> Value {
        match self {
            PatchValue::Fixed(fixed) => fixed.value().clone(),
            PatchValue::Owned(value) => value.clone(),
            PatchValue::String(text) => Value::String(text.clone()),
            PatchValue::Array(items) => {
                Value::Array(items.iter().map(PatchValue::to_value).collect())
            }
            PatchValue::Object(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.to_value()))
                    .collect::<Map<String, Value>>(),
            ),
            PatchValue::Rendered(node, texts) => {
                let mut texts = texts.iter();
                rendered_value(node, &mut texts)
            }
        }
    }

    /// Whether everything this value sets, `theirs` sets to the same value. The API server
    /// defaults fields of what was injected (imagePullPolicy, terminationMessagePath, …), so an
    /// injected item that comes back is a subset of what is there, not equal to it.
    pub fn is_subset_of(&self, theirs: &Value) -> bool {
        match self {
            PatchValue::Fixed(fixed) => is_subset(fixed.value(), theirs),
            PatchValue::Owned(value) => is_subset(value, theirs),
            PatchValue::String(text) => theirs.as_str() == Some(text.as_str()),
            PatchValue::Array(items) => theirs.as_array().is_some_and(|t| {
                t.len() == items.len() && items.iter().zip(t).all(|(v, w)| v.is_subset_of(w))
            }),
            PatchValue::Object(fields) => theirs.as_object().is_some_and(|t| {
                fields
                    .iter()
                    .all(|(k, v)| t.get(*k).is_some_and(|w| v.is_subset_of(w)))
            }),
            PatchValue::Rendered(node, texts) => {
                let mut texts = texts.iter();
                rendered_is_subset(node, &mut texts, theirs)
            }
        }
    }
}

/// The value of `node` with its strings with placeholders taken from `texts`, in order.
fn rendered_value<'s>(node: &Node, texts: &mut impl Iterator<Item = &'s String>) -> Value {
    match node {
        Node::Fixed(fixed) => fixed.value().clone(),
        Node::Text(_) => Value::String(texts.next().cloned().unwrap_or_default()),
        Node::Array(items) => {
            Value::Array(items.iter().map(|n| rendered_value(n, texts)).collect())
        }
        Node::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, n)| (k.clone(), rendered_value(n, texts)))
                .collect(),
        ),
    }
}

/// [`PatchValue::is_subset_of`] for `node` with its strings with placeholders taken from
/// `texts`, in order. Every text is taken, whatever the answer, so that siblings read theirs.
fn rendered_is_subset<'s>(
    node: &Node,
    texts: &mut impl Iterator<Item = &'s String>,
    theirs: &Value,
) -> bool {
    match node {
        Node::Fixed(fixed) => is_subset(fixed.value(), theirs),
        Node::Text(_) => texts
            .next()
            .is_some_and(|text| theirs.as_str() == Some(text.as_str())),
        Node::Array(items) => {
            let theirs = theirs.as_array().filter(|t| t.len() == items.len());
            let mut all = theirs.is_some();
            for (at, item) in items.iter().enumerate() {
                let their = theirs.and_then(|t| t.get(at)).unwrap_or(&Value::Null);
                all &= rendered_is_subset(item, texts, their);
            }
            all
        }
        Node::Object(fields) => {
            let theirs = theirs.as_object();
            let mut all = theirs.is_some();
            for (key, value) in fields.iter() {
                let their = theirs.and_then(|t| t.get(key));
                all &= rendered_is_subset(value, texts, their.unwrap_or(&Value::Null))
                    && their.is_some();
            }
            all
        }
    }
}

/// Whether everything `ours` sets, `theirs` sets to the same value.
pub fn is_subset(ours: &Value, theirs: &Value) -> bool {
    match (ours, theirs) {
        (Value::Object(a), Value::Object(b)) => a
            .iter()
            .all(|(k, v)| b.get(k).is_some_and(|w| is_subset(v, w))),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(v, w)| is_subset(v, w))
        }
        _ => ours == theirs,
    }
}

impl Serialize for PatchValue<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            PatchValue::Fixed(fixed) => fixed.value().serialize(serializer),
            PatchValue::Owned(value) => value.serialize(serializer),
            PatchValue::String(text) => serializer.serialize_str(text),
            PatchValue::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            PatchValue::Object(fields) => {
                let mut map = serializer.serialize_map(Some(fields.len()))?;
                for (key, value) in fields {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
            PatchValue::Rendered(..) => self.to_value().serialize(serializer),
        }
    }
}

/// Where an operation adds: an RFC 6901 JSON pointer, its fixed part spelled escaped by the
/// planner and each token it adds escaped as it is added.
/// Not a `PointerBuf`, which checks again the text it is given (a share of each patch's
/// cost); it is made one to apply the patch ([`Patch::to_json_patch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchPath(String);

impl PatchPath {
    /// The pointer whose text is `escaped`, which the caller guarantees is one (empty, or
    /// `/`-separated tokens with `~` and `/` escaped): the planner spells the fixed part of its
    /// paths (`/spec/containers`) itself rather than escaping it for every Pod.
    pub(crate) fn escaped(escaped: &str) -> Self {
        // Room for an item's index or key after it.
        let mut path = String::with_capacity(escaped.len() + 24);
        path.push_str(escaped);
        PatchPath(path)
    }

    /// The pointer `escaped` (as [`PatchPath::escaped`]), then `token` escaped: made with room
    /// for every byte of `token` escaped, so that a long key (a label's, with a `/`) does not
    /// grow it again.
    pub(crate) fn escaped_then(escaped: &str, token: &str) -> Self {
        let mut path = String::with_capacity(escaped.len() + 1 + 2 * token.len());
        path.push_str(escaped);
        push_token(&mut path, token);
        PatchPath(path)
    }

    /// This pointer, then the tokens of `escaped`, already escaped (`"/env"`).
    pub(crate) fn then_escaped(mut self, escaped: &str) -> Self {
        self.0.push_str(escaped);
        self
    }

    /// This pointer, then a list's `index`.
    pub(crate) fn then_index(mut self, index: usize) -> Self {
        self.0.push('/');
        self.0.push_str(itoa::Buffer::new().format(index));
        self
    }

    /// The pointer's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The same pointer as a `PointerBuf`.
    pub fn to_pointer(&self) -> PointerBuf {
        PointerBuf::from_tokens(
            self.0
                .split('/')
                .skip(1)
                .map(|token| token.replace("~1", "/").replace("~0", "~")),
        )
    }
}

/// Appends `/` and `token`, escaped. The plain runs between escapes are copied whole: `~` and
/// `/` are ASCII, so they split the token at character boundaries.
fn push_token(path: &mut String, token: &str) {
    path.push('/');
    let mut rest = token;
    while let Some((plain, escaped)) = rest
        .bytes()
        .position(|byte| byte == b'~' || byte == b'/')
        .and_then(|at| rest.split_at_checked(at))
    {
        path.push_str(plain);
        path.push_str(if escaped.starts_with('~') { "~0" } else { "~1" });
        rest = escaped.get(1..).unwrap_or_default();
    }
    path.push_str(rest);
}

/// One RFC 6902 `add` operation (the only kind the injector needs: it never removes or
/// overwrites what the Pod has).
#[derive(Clone, Debug, PartialEq)]
pub struct AddOperation<'t> {
    /// Where.
    pub path: PatchPath,
    /// What.
    pub value: PatchValue<'t>,
}

impl Serialize for AddOperation<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut op = serializer.serialize_struct("AddOperation", 3)?;
        op.serialize_field("op", "add")?;
        op.serialize_field("path", self.path.as_str())?;
        op.serialize_field("value", &self.value)?;
        op.end()
    }
}

/// Where [`Patch::write_json`] writes the patch's JSON: text as it comes, and each fixed part
/// of a template, which a sink may copy in a form it made once (see [`Base64Out`]).
pub trait JsonOut {
    /// Writes `bytes` of JSON text.
    fn text(&mut self, bytes: &[u8]);

    /// Writes JSON text of a template, written when it was compiled.
    fn json(&mut self, json: &JsonText) {
        self.text(json.get().as_bytes());
    }
}

impl JsonOut for Vec<u8> {
    fn text(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// A sink that writes the base64 of the JSON into `out`, as an AdmissionResponse carries a
/// patch. A fixed part of a template is copied from its own base64, made once
/// ([`Fixed::base64_from`]), instead of being encoded again for every Pod: only the bytes
/// around it that share a 3-byte group with the text before or after are encoded here. The
/// bytes are those of encoding the whole JSON at once.
pub struct Base64Out<'o> {
    out: &'o mut Vec<u8>,
    /// Text not encoded yet (`pending[..pending_len]`): encoded in whole groups of 3 when the
    /// buffer is full and before a fixed part, the rest (up to 2 bytes) kept for the next
    /// group. On the stack, where it is warm: a buffer of the heap's was an allocation, and
    /// memory no cache held, on every request.
    pending: [u8; PENDING_BYTES],
    pending_len: usize,
}

/// Appends the base64 of `bytes` to `out`.
fn append_base64(bytes: &[u8], out: &mut Vec<u8>) {
    use base64::Engine as _;
    let start = out.len();
    // `resize` grows `out` by doubling, so a long patch is not copied at every flush.
    out.resize(start + bytes.len().div_ceil(3) * 4, 0);
    let written = BASE64
        .encode_slice(bytes, &mut out[start..])
        .unwrap_or_default();
    out.truncate(start + written);
}

/// Text gathered before it is encoded: a multiple of 3, so that a full buffer is encoded whole.
const PENDING_BYTES: usize = 1536;

/// Fixed parts shorter than this are encoded with the text around them.
const COPIED_FIXED_BYTES: usize = 48;

impl<'o> Base64Out<'o> {
    /// A sink appending to `out`.
    pub fn new(out: &'o mut Vec<u8>) -> Self {
        Base64Out {
            out,
            pending: [0; PENDING_BYTES],
            pending_len: 0,
        }
    }

    /// Encodes the pending text's whole groups of 3, keeping the rest.
    fn flush_groups(&mut self) {
        let whole = self.pending_len / 3 * 3;
        append_base64(&self.pending[..whole], self.out);
        self.pending.copy_within(whole..self.pending_len, 0);
        self.pending_len -= whole;
    }

    /// Encodes what is left, with padding.
    pub fn finish(self) {
        append_base64(&self.pending[..self.pending_len], self.out);
    }

    /// [`JsonOut::text`] for a text that fills the buffer: it goes through the buffer
    /// whatever its length, encoded each time the buffer is full.
    #[inline(never)]
    fn text_filling(&mut self, mut bytes: &[u8]) {
        loop {
            let room = PENDING_BYTES - self.pending_len;
            let (now, rest) = bytes.split_at(bytes.len().min(room));
            self.pending[self.pending_len..self.pending_len + now.len()].copy_from_slice(now);
            self.pending_len += now.len();
            if self.pending_len < PENDING_BYTES {
                return;
            }
            self.flush_groups();
            bytes = rest;
        }
    }
}

impl JsonOut for Base64Out<'_> {
    #[inline]
    fn text(&mut self, bytes: &[u8]) {
        let end = self.pending_len + bytes.len();
        match self.pending.get_mut(self.pending_len..end) {
            Some(room) if end < PENDING_BYTES => {
                room.copy_from_slice(bytes);
                self.pending_len = end;
            }
            _ => self.text_filling(bytes),
        }
    }

    fn json(&mut self, json: &JsonText) {
        let text = json.get().as_bytes();
        if text.len() < COPIED_FIXED_BYTES {
            return self.text(text);
        }
        // The first bytes complete the group the pending text started; from there on the
        // text's groups are its own.
        let skip = (3 - self.pending_len % 3) % 3;
        let Some(encoded) = json.base64_from(skip) else {
            return self.text(text);
        };
        self.text(&text[..skip]);
        self.flush_groups();
        self.out.extend_from_slice(encoded.as_bytes());
        let copied = skip + (text.len() - skip) / 3 * 3;
        self.text(&text[copied..]);
    }
}

/// Writes a value made for this Pod.
fn write_owned<O: JsonOut + ?Sized>(value: &Value, out: &mut O) -> Result<(), serde_json::Error> {
    if let Value::String(text) = value {
        write_str(text, out);
        return Ok(());
    }
    let mut json = Vec::new();
    serde_json::to_writer(&mut json, value)?;
    out.text(&json);
    Ok(())
}

/// Writes a JSON string as `serde_json` does.
fn write_str<O: JsonOut + ?Sized>(text: &str, out: &mut O) {
    if is_plain(text.as_bytes()) {
        out.text(b"\"");
        out.text(text.as_bytes());
        out.text(b"\"");
    } else {
        out.text(&escaped(text));
    }
}

/// Whether `bytes` go into a JSON string as they are: no quote, backslash or control
/// character.
fn is_plain(bytes: &[u8]) -> bool {
    !bytes.iter().any(|&b| b == b'"' || b == b'\\' || b < 0x20)
}

/// `text` as a JSON string, with escapes, as `serde_json` writes it.
fn escaped(text: &str) -> Vec<u8> {
    let mut json = Vec::with_capacity(text.len() + 8);
    // Writing a string into a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut json, text);
    json
}

/// Writes a value of the patch.
fn write_value<O: JsonOut + ?Sized>(
    value: &PatchValue<'_>,
    out: &mut O,
) -> Result<(), serde_json::Error> {
    match value {
        PatchValue::Fixed(fixed) => out.json(fixed.json()),
        PatchValue::Owned(value) => write_owned(value, out)?,
        PatchValue::String(text) => write_str(text, out),
        PatchValue::Array(items) => {
            out.text(b"[");
            for (at, item) in items.iter().enumerate() {
                if at > 0 {
                    out.text(b",");
                }
                write_value(item, out)?;
            }
            out.text(b"]");
        }
        PatchValue::Object(fields) => {
            out.text(b"{");
            for (at, (key, value)) in fields.iter().enumerate() {
                if at > 0 {
                    out.text(b",");
                }
                write_str(key, out);
                out.text(b":");
                write_value(value, out)?;
            }
            out.text(b"}");
        }
        PatchValue::Rendered(node, texts) => {
            let mut texts = texts.iter();
            for piece in node.layout().iter() {
                match piece {
                    Piece::Json(json) => out.json(json),
                    Piece::Text => write_str(texts.next().map_or("", String::as_str), out),
                }
            }
        }
    }
    Ok(())
}

/// An RFC 6902 JSON patch, serialized as the JSON array the API server expects.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Patch<'t>(pub Vec<AddOperation<'t>>);

impl Patch<'_> {
    /// Whether the patch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many operations the patch holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The same patch, owning its values (to keep it beyond the templates it borrows from).
    pub fn into_owned(self) -> Patch<'static> {
        Patch(
            self.0
                .into_iter()
                .map(|op| AddOperation {
                    value: PatchValue::Owned(op.value.to_value()),
                    path: op.path,
                })
                .collect(),
        )
    }

    /// Writes the patch's JSON, the same as `serde_json::to_vec` gives, to `out`.
    pub fn write_json<O: JsonOut + ?Sized>(&self, out: &mut O) -> Result<(), serde_json::Error> {
        out.text(b"[");
        for (at, operation) in self.0.iter().enumerate() {
            out.text(if at == 0 {
                br#"{"op":"add","path":"#
            } else {
                br#",{"op":"add","path":"#
            });
            write_str(operation.path.as_str(), out);
            out.text(br#","value":"#);
            write_value(&operation.value, out)?;
            out.text(b"}");
        }
        out.text(b"]");
        Ok(())
    }

    /// The patch as JSON: the same bytes as `serde_json::to_vec`, but each fixed part of a
    /// template is copied as it was written when the template was compiled.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut json = Vec::with_capacity(4096);
        self.write_json(&mut json)?;
        Ok(json)
    }

    /// Appends the base64 of the patch's JSON (of [`Patch::to_json`]) to `out`, copying each
    /// fixed part's own base64 (see `Base64Out`).
    pub fn write_base64(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        let mut sink = Base64Out::new(out);
        self.write_json(&mut sink)?;
        sink.finish();
        Ok(())
    }

    /// An owned `json_patch::Patch`, to apply it.
    pub fn to_json_patch(&self) -> json_patch::Patch {
        json_patch::Patch(
            self.0
                .iter()
                .map(|op| {
                    json_patch::PatchOperation::Add(json_patch::AddOperation {
                        path: op.path.to_pointer(),
                        value: op.value.to_value(),
                    })
                })
                .collect(),
        )
    }
}

impl Serialize for Patch<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

#[cfg(test)]
mod tests;
