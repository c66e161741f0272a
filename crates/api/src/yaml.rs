//! YAML that Kubernetes tools read back as written.
//!
//! kubectl, helm and the API server's YAML reader (sigs.k8s.io/yaml over go-yaml) resolve
//! plain scalars by YAML 1.1 rules: a bare `yes`, `on`, `n`, `~`, `0755`, `0x1F`, `1_000`,
//! `1:30`, `.inf`, `2024-01-01`, `=` or `<<` is not the string it looks like. Everything the
//! project prints as YAML goes through [`to_string`], which quotes every such string (and any
//! with leading or trailing spaces), so what is written is what is read.

use serde::Serialize;

/// Why a value cannot be written as YAML.
pub type YamlError = serde_saphyr::SerializeError;

/// `value` as a YAML document that a YAML 1.1 reader (kubectl) reads back unchanged.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, YamlError> {
    let options = serde_saphyr::ser_options! {
        // Quote by YAML 1.1's rules (kubectl's), not only by YAML 1.2's narrower ones.
        yaml_12: false,
        // A long single-line string stays one plain or quoted line: no folded (`>`) block,
        // whose rewrapping makes generated files harder to read and diff. Strings holding a
        // newline are still written as literal (`|`) blocks.
        folded_wrap_chars: usize::MAX,
    };
    serde_saphyr::to_string_with_options(value, options)
}

#[cfg(test)]
mod tests;
