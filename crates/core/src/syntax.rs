//! Syntax checks for Kubernetes names, label keys and label values.

/// A DNS-1123 label: at most 63 lowercase alphanumerics or '-', starting and ending alphanumeric.
pub fn is_dns_label(name: &str) -> bool {
    name.len() <= 63
        && !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// A DNS-1123 subdomain: at most 253 characters of dot-separated DNS labels.
pub fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

/// [`is_label_value`] as a regular expression (RE2 and Rust alike), for CEL's `matches`.
pub const LABEL_VALUE_PATTERN: &str = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";

/// A label value: empty, or at most 63 alphanumerics, '-', '_' or '.', starting and ending
/// alphanumeric.
pub fn is_label_value(value: &str) -> bool {
    value.is_empty() || is_qualified_name_part(value)
}

/// A label or annotation key: an optional DNS subdomain prefix and '/', then a name part.
pub fn is_qualified_name(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_qualified_name_part(name),
        None => is_qualified_name_part(key),
    }
}

fn is_qualified_name_part(name: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_alphanumeric();
    let bytes = name.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            bytes.len() <= 63
                && alnum(first)
                && alnum(last)
                && bytes
                    .iter()
                    .all(|&b| alnum(b) || b == b'-' || b == b'_' || b == b'.')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
