//! What a template injects, as a short fingerprint recorded on every Pod it is applied to.
//!
//! The generation changes with any edit of a template, but only an edit of what it injects
//! makes the Pods that carry it stale: a priority, selector or failure-policy change does not.
//! So each entry of the `sidecar.dev/injected` record carries a fingerprint of the injected
//! parts as written (placeholders unrendered, so one template has one fingerprint for all its
//! Pods), in two halves: everything but the images, and the images. Equal halves: current;
//! only the images differ: the change can be made in place.

use std::fmt;

use injector_api::{AppContainers, InjectedMetadata, SidecarTemplateSpec};
use k8s_openapi::api::core::v1::{Container, LocalObjectReference, Volume};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// The fingerprint of what a template injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    /// Of everything injected, with the containers' images left out.
    shape: u32,
    /// Of the images of the containers and init containers, by container name.
    images: u32,
}

/// The injected parts of a spec, the way they are hashed.
#[derive(Serialize)]
struct Injected<'s> {
    containers: Vec<serde_json::Value>,
    init_containers: Vec<serde_json::Value>,
    volumes: &'s [Volume],
    image_pull_secrets: &'s [LocalObjectReference],
    app_containers: &'s Option<AppContainers>,
    metadata: &'s Option<InjectedMetadata>,
}

impl Fingerprint {
    /// The fingerprint of what `spec` injects.
    pub fn of(spec: &SidecarTemplateSpec) -> Self {
        let without_image = |containers: &[Container]| {
            containers
                .iter()
                .map(|c| {
                    let mut value = serde_json::to_value(c).unwrap_or_default();
                    if let Some(object) = value.as_object_mut() {
                        object.remove("image");
                    }
                    value
                })
                .collect()
        };
        let shape = Injected {
            containers: without_image(&spec.containers),
            init_containers: without_image(&spec.init_containers),
            volumes: &spec.volumes,
            image_pull_secrets: &spec.image_pull_secrets,
            app_containers: &spec.app_containers,
            metadata: &spec.metadata,
        };
        let images: Vec<(&str, Option<&str>)> = spec
            .containers
            .iter()
            .chain(&spec.init_containers)
            .map(|c| (c.name.as_str(), c.image.as_deref()))
            .collect();
        Fingerprint {
            shape: digest(&shape),
            images: digest(&images),
        }
    }

    /// Whether `self` and `other` differ in the images only.
    pub fn only_images_differ(&self, other: &Fingerprint) -> bool {
        self.shape == other.shape && self.images != other.images
    }

    /// Reads the 16 hex digits [`Display`](fmt::Display) writes.
    pub fn parse(text: &str) -> Option<Self> {
        if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let (shape, images) = text.split_at(8);
        Some(Fingerprint {
            shape: u32::from_str_radix(shape, 16).ok()?,
            images: u32::from_str_radix(images, 16).ok()?,
        })
    }
}

impl Fingerprint {
    /// The 16 hex digits [`Display`](fmt::Display) writes.
    pub fn hex(&self) -> impl std::ops::Deref<Target = str> {
        // Written on every admission (the record and the log): by hand, as `{:08x}{:08x}`
        // would write it, without `fmt`'s padding machinery.
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hex = [0u8; 16];
        let halves = (u64::from(self.shape) << 32) | u64::from(self.images);
        for (at, digit) in hex.iter_mut().enumerate() {
            let nibble = (halves >> (60 - 4 * at)) & 0xf;
            *digit = DIGITS[nibble as usize];
        }
        HexDigits(hex)
    }
}

/// 16 hex digits, ASCII.
struct HexDigits([u8; 16]);

impl std::ops::Deref for HexDigits {
    type Target = str;

    fn deref(&self) -> &str {
        // Only hex digits are written, all ASCII.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

/// As its 16 hex digits (what `render --explain` and the record show).
impl Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The first 32 bits of the SHA-256 of `value`'s JSON (serde_json writes maps in key order and
/// structs in field order, so equal values hash equal).
fn digest(value: &impl Serialize) -> u32 {
    let json = serde_json::to_vec(value).unwrap_or_default();
    let hash = Sha256::digest(&json);
    u32::from_be_bytes([hash[0], hash[1], hash[2], hash[3]])
}

#[cfg(test)]
mod tests;
