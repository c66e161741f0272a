//! The record, `sidecar.dev/injected`: `name@generation#fingerprint` entries separated by
//! commas. How its entries are read and how a template's entry is written, in Rust for `plan`,
//! the census and the rollouts, beside the CEL the policy writes it with and the
//! after-admission policy reads it with.

use std::fmt;

use injector_api::names::INJECTED_ANNOTATION;

use super::selection::ANNOTATIONS;
use crate::cel::cel_string;
use crate::fingerprint::Fingerprint;

/// The entries of a record, trimmed, empty ones dropped.
pub fn entries(record: &str) -> impl Iterator<Item = &str> {
    record
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
}

/// [`entries`] of the admitted Pod's record, as a CEL list of strings.
pub(crate) fn entries_cel() -> String {
    format!(
        "{}.split(\",\").map(e, e.trim()).filter(e, e != \"\")",
        record_cel()
    )
}

/// The template an entry names: what comes before its last `@`.
pub fn entry_name(entry: &str) -> &str {
    entry.rsplit_once('@').map_or(entry, |(name, _)| name)
}

/// [`entry_name`] of the entry `e`, in CEL.
pub(crate) const ENTRY_NAME_CEL: &str =
    "(e.lastIndexOf(\"@\") >= 0 ? e.substring(0, e.lastIndexOf(\"@\")) : e)";

/// The template names of a record.
pub fn names(record: &str) -> impl Iterator<Item = &str> {
    entries(record).map(entry_name)
}

/// One entry of a Pod's record, read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded<'a> {
    /// The template's name.
    pub name: &'a str,
    /// The generation it was injected at, when written.
    pub generation: Option<i64>,
    /// What it injected, when written (records from before fingerprints have none).
    pub fingerprint: Option<Fingerprint>,
}

impl<'a> Recorded<'a> {
    /// Reads `name@generation#fingerprint` (each part after the name optional).
    pub fn parse(entry: &'a str) -> Self {
        let (rest, fingerprint) = match entry.rsplit_once('#') {
            Some((rest, fingerprint)) => (rest, Fingerprint::parse(fingerprint)),
            None => (entry, None),
        };
        let (name, generation) = match rest.rsplit_once('@') {
            Some((name, generation)) => (name, generation.parse().ok()),
            None => (rest, None),
        };
        Recorded {
            name,
            generation,
            fingerprint,
        }
    }
}

/// A template's entry as it is now (`CompiledTemplate::entry`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'t> {
    /// The template's name.
    pub name: &'t str,
    /// Its generation.
    pub generation: i64,
    /// What it injects.
    pub fingerprint: Fingerprint,
}

impl fmt::Display for Entry<'_> {
    /// `name@generation#fingerprint`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_entry(f, self.name, self.generation, &self.fingerprint)
    }
}

/// At most the bytes of an entry besides the name: `@`, a generation (up to 20), `#` and 16
/// hex digits.
pub const ENTRY_EXTRA: usize = 38;

/// Writes `name@generation#fingerprint` to `out`: on every admission (the record, its audit
/// annotation and the log) straight into the string that holds the record. With `write_str`
/// only, so that a caller's width or sign flags reach none of it.
pub fn write_entry(
    out: &mut impl fmt::Write,
    name: &str,
    generation: i64,
    fingerprint: &Fingerprint,
) -> fmt::Result {
    out.write_str(name)?;
    out.write_char('@')?;
    out.write_str(itoa::Buffer::new().format(generation))?;
    out.write_char('#')?;
    out.write_str(&fingerprint.hex())
}

/// The record `plan` writes: the entries of `claimed` where they stand, the first one of each
/// template only; an entry of a template of `present` (found in the Pod by its content)
/// rewritten as that template's now; one of a template of `absent` (selecting the Pod, not in
/// it) dropped; the rest of `present` after them, in order. Claims about templates not
/// decided here are left as they are, for whoever decides them.
pub fn updated(claimed: &str, present: &[Entry<'_>], absent: &[&str]) -> String {
    let mut unrecorded = present.to_vec();
    let mut record = String::with_capacity(
        claimed.len()
            + unrecorded
                .iter()
                .map(|t| t.name.len() + ENTRY_EXTRA + 1)
                .sum::<usize>(),
    );
    // Entries are never empty, so a comma goes before each but the first.
    let separate = |record: &mut String| {
        if !record.is_empty() {
            record.push(',');
        }
    };
    let push_template = |record: &mut String, t: &Entry<'_>| {
        separate(record);
        // Writing into a `String` cannot fail.
        let _ = write_entry(record, t.name, t.generation, &t.fingerprint);
    };
    let mut listed: Vec<&str> = Vec::new();
    for entry in entries(claimed) {
        let name = entry_name(entry);
        if listed.contains(&name) {
            continue;
        }
        listed.push(name);
        if let Some(at) = unrecorded.iter().position(|t| t.name == name) {
            push_template(&mut record, &unrecorded.remove(at));
        } else if !absent.contains(&name) {
            separate(&mut record);
            record.push_str(entry);
        }
    }
    for entry in &unrecorded {
        push_template(&mut record, entry);
    }
    record
}

/// [`updated`] for one template's `entry` present, as the policy writes it (a CEL string): its entry
/// in place of the entries naming it, else at the end. Unlike `plan`, it keeps a second entry
/// of a template and a claim of one the policy left to the webhook; the webhook, called for
/// such a Pod, writes the record `plan` does. A Pod without a record (most) gets the entry
/// without the record being split, mapped and joined.
pub(crate) fn updated_cel(entry: Entry<'_>) -> String {
    let name = cel_string(entry.name);
    let entry = cel_string(&entry.to_string());
    let entries = entries_cel();
    format!(
        "({} == \"\" ? {entry} : ({entries}.exists(e, {ENTRY_NAME_CEL} == {name}) ? {entries}.map(e, {ENTRY_NAME_CEL} == {name} ? {entry} : e) : {entries} + [{entry}]).join(\",\"))",
        record_cel()
    )
}

/// The admitted Pod's record as written (`""` when it has none), in CEL.
fn record_cel() -> String {
    format!(
        "{ANNOTATIONS}[?{}].orValue(\"\")",
        cel_string(INJECTED_ANNOTATION)
    )
}

/// `record` with the entries of `entry`'s template rewritten to `entry`, as an update in place
/// leaves it; `None` when the record has no entry for it.
pub fn rewritten(record: &str, entry: Entry<'_>) -> Option<String> {
    let mut found = false;
    let entries: Vec<String> = entries(record)
        .map(|existing| {
            if entry_name(existing) == entry.name {
                found = true;
                entry.to_string()
            } else {
                existing.to_owned()
            }
        })
        .collect();
    found.then(|| entries.join(","))
}

#[cfg(test)]
mod tests;
