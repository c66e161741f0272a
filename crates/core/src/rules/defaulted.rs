//! Whether a container or volume already in a Pod is the one a template adds.
//!
//! A Pod's own claim that it was injected is never trusted (docs/architecture.md, decision 3):
//! what counts is content. The webhook sees the Pod after the API server has filled in its
//! defaults, and on a re-invocation after admission plugins have added to the injected
//! containers (the ServiceAccount token mount, a LimitRange's resources). So "equal" here is
//! exact equality up to those additions and nothing else: a look-alike with another
//! `command`, `args`, `env`, `securityContext`, … is different, and the first field that
//! differs is named.
//!
//! The defaults are those of `k8s.io/kubernetes/pkg/apis/core/v1` (`SetDefaults_*` and the
//! generated `SetObjectDefaults_Pod`).

use serde_json::{Map, Value};

use crate::cel::cel_string;

/// What kind of Pod item is compared: each has its own defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemKind {
    /// An entry of `spec.containers` or `spec.initContainers`.
    Container,
    /// An entry of `spec.volumes`.
    Volume,
}

/// Where the ServiceAccount admission plugin mounts the API token into every container.
pub(crate) const SERVICE_ACCOUNT_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// What of the Pod around an item its comparison depends on.
#[derive(Clone, Copy, Debug, Default)]
pub struct Surroundings<'a> {
    /// `spec.hostNetwork`: the API server then defaults each port's `hostPort`.
    pub host_network: bool,
    /// The Pod's volumes holding a ServiceAccount token (projected, with a
    /// `serviceAccountToken` source): the only ones the ServiceAccount plugin mounts.
    pub token_volumes: &'a [&'a str],
}

/// The first field in which `theirs` (an item of the Pod) is not `ours` (the item a template
/// adds) up to the API server's defaults, as a path relative to the item (`command`,
/// `env[1].value`, …); `None` when they are the same.
pub fn difference(
    ours: &Value,
    theirs: &Value,
    kind: ItemKind,
    pod: &Surroundings<'_>,
) -> Option<String> {
    let (Value::Object(ours), Value::Object(theirs)) = (ours, theirs) else {
        return (ours != theirs).then(String::new);
    };
    let context = match kind {
        ItemKind::Container => Context::Container,
        ItemKind::Volume => Context::Volume,
    };
    object_difference(ours, theirs, context, "", pod)
}

/// Which defaults apply to the keys of the object being compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Context {
    Container,
    /// An entry of a container's `volumeMounts`.
    Mount,
    Port,
    Probe,
    HttpGet,
    Env,
    EnvSource,
    FieldRef,
    FileKeyRef,
    /// `resources` of a container: quantities compare by value, and keys a LimitRange adds are
    /// tolerated.
    Resources,
    /// An object holding a quantity (`emptyDir.sizeLimit`, `resourceFieldRef.divisor`).
    Quantities,
    Volume,
    /// A `secret`, `configMap`, `downwardAPI` or `projected` volume source.
    ModedSource,
    HostPath,
    Iscsi,
    ImageSource,
    Projection,
    TokenProjection,
    ClaimSpec,
    /// A `persistentVolumeClaim` volume source.
    ClaimSource,
    Other,
}

fn child_context(parent: Context, key: &str) -> Context {
    use Context::*;
    match (parent, key) {
        (Container, "ports") => Port,
        (Container, "livenessProbe" | "readinessProbe" | "startupProbe") => Probe,
        (Container, "env") => Env,
        (Container, "resources") => Resources,
        (Container, "lifecycle") => Other,
        (Probe, "httpGet") => HttpGet,
        (Other, "httpGet") => HttpGet,
        (Env, "valueFrom") => EnvSource,
        (EnvSource, "fieldRef") => FieldRef,
        (EnvSource, "fileKeyRef") => FileKeyRef,
        (Volume, "secret" | "configMap" | "downwardAPI" | "projected") => ModedSource,
        (Volume, "hostPath") => HostPath,
        (Volume, "iscsi") => Iscsi,
        (Volume, "image") => ImageSource,
        (Volume, "emptyDir") => Quantities,
        (EnvSource | ModedSource, "resourceFieldRef") => Quantities,
        (ClaimSpec, "resources") => Resources,
        (Resources, _) => Resources,
        (Quantities, _) => Quantities,
        (Volume, "ephemeral") => Other,
        (Volume, "persistentVolumeClaim") => ClaimSource,
        (Other, "volumeClaimTemplate") => Other,
        (Other, "spec") => ClaimSpec,
        (ModedSource, "items") => ModedSource,
        (ModedSource, "fieldRef") => FieldRef,
        (ModedSource, "sources") => Projection,
        (Projection, "downwardAPI") => ModedSource,
        (Projection, "serviceAccountToken") => TokenProjection,
        (Projection, "configMap" | "secret") => Other,
        _ => Other,
    }
}

/// A `secret`, `configMap`, `downwardAPI` or `projected` volume's `defaultMode` (0644).
const DEFAULT_MODE: i64 = 420;
/// A `hostPath` volume's `type`.
const HOST_PATH_TYPE: &str = "";
/// A projected ServiceAccount token's `expirationSeconds`.
const TOKEN_EXPIRATION_SECONDS: i64 = 3600;
/// A `fieldRef`'s `apiVersion`.
const FIELD_REF_API_VERSION: &str = "v1";

/// Whether the API server (or an admission plugin it always runs) puts `key: value` into an
/// object of this context when the template left the key out. `ours` is the template's object.
fn is_filled_in(
    context: Context,
    key: &str,
    value: &Value,
    ours: &Map<String, Value>,
    pod: &Surroundings<'_>,
) -> bool {
    use Context::*;
    if is_empty(value) {
        // Go's encoder writes some unset structs (`resources: {}`).
        return true;
    }
    match (context, key) {
        (Container, "terminationMessagePath") => value == "/dev/termination-log",
        (Container, "terminationMessagePolicy") => value == "File",
        (Container, "imagePullPolicy") => {
            // The AlwaysPullImages admission plugin, where enabled, sets Always.
            value == "Always"
                || Some(value.as_str().unwrap_or_default())
                    == ours
                        .get("image")
                        .and_then(Value::as_str)
                        .map(default_pull_policy)
        }
        // A LimitRange's defaults (the LimitRanger admission plugin).
        (Container, "resources") => true,
        (Container, "volumeMounts") => value
            .as_array()
            .is_some_and(|mounts| mounts.iter().all(|m| is_service_account_mount(m, pod))),
        (Port, "protocol") => value == "TCP",
        // A hostNetwork Pod's ports are defaulted to listen on the host.
        (Port, "hostPort") => pod.host_network && Some(value) == ours.get("containerPort"),
        (Probe, "timeoutSeconds") => value == 1,
        (Probe, "periodSeconds") => value == 10,
        (Probe, "successThreshold") => value == 1,
        (Probe, "failureThreshold") => value == 3,
        (HttpGet, "path") => value == "/",
        (HttpGet, "scheme") => value == "HTTP",
        (FieldRef, "apiVersion") => value == FIELD_REF_API_VERSION,
        (FileKeyRef, "optional") => value == false,
        (Resources, _) => true,
        (Volume, "emptyDir") => !ours.keys().any(|k| k != "name"),
        (ModedSource, "defaultMode") => value == DEFAULT_MODE,
        (HostPath, "type") => value == HOST_PATH_TYPE,
        (Iscsi, "iscsiInterface") => value == "default",
        (ImageSource, "pullPolicy") => {
            Some(value.as_str().unwrap_or_default())
                == ours
                    .get("reference")
                    .and_then(Value::as_str)
                    .map(default_pull_policy)
        }
        (TokenProjection, "expirationSeconds") => value == TOKEN_EXPIRATION_SECONDS,
        (ClaimSpec, "volumeMode") => value == "Filesystem",
        _ => false,
    }
}

/// Whether the API server drops `key` when the template sets it to `ours`, a zero value: Go
/// leaves out an `omitempty` field that is not a pointer, so `readOnly: false` comes back as
/// no `readOnly` (where the field is a pointer, as in a `securityContext`, `false` stays and
/// its absence is a difference).
fn is_dropped_zero(context: Context, key: &str, ours: &Value) -> bool {
    use Context::*;
    let zero = ours == false || ours == 0;
    zero && matches!(
        (context, key),
        (Container, "stdin" | "stdinOnce" | "tty")
            | (Mount | ClaimSource, "readOnly")
            | (Port, "hostPort")
            | (Probe, "initialDelaySeconds")
    )
}

/// Whether the API server replaces the zero value `ours` of `key` by `theirs`: a probe's zero
/// timings, an `httpGet`'s empty path and scheme are defaulted as if left out.
fn is_defaulted_zero(context: Context, key: &str, ours: &Value, theirs: &Value) -> bool {
    zero_default(context, key, ours).is_some_and(|default| *theirs == default)
}

/// What the API server puts in place of `ours` for `key` when `ours` is a zero it defaults
/// ([`is_defaulted_zero`]; the policy's CEL asks the same, `holds`).
fn zero_default(context: Context, key: &str, ours: &Value) -> Option<Value> {
    use Context::*;
    let (default, zero) = match (context, key) {
        (Probe, "timeoutSeconds" | "successThreshold") => (Value::from(1), Value::from(0)),
        (Probe, "periodSeconds") => (Value::from(10), Value::from(0)),
        (Probe, "failureThreshold") => (Value::from(3), Value::from(0)),
        (HttpGet, "path") => (Value::from("/"), Value::from("")),
        (HttpGet, "scheme") => (Value::from("HTTP"), Value::from("")),
        _ => return None,
    };
    (*ours == zero).then_some(default)
}

/// The pull policy the API server gives a container with this image and none of its own.
fn default_pull_policy(image: &str) -> &'static str {
    // The tag is what follows the last ':' after the last '/', unless a digest pins the image.
    let without_digest = image.split_once('@').map_or(image, |(name, _)| name);
    let last_part = without_digest.rsplit('/').next().unwrap_or(without_digest);
    let tag = last_part.rsplit_once(':').map(|(_, tag)| tag);
    if image.contains('@') && tag.is_none() {
        return "IfNotPresent";
    }
    match tag {
        None | Some("latest") => "Always",
        Some(_) => "IfNotPresent",
    }
}

/// The prefix of the name of the volume the ServiceAccount admission plugin adds.
pub(crate) const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";

/// The mount the ServiceAccount admission plugin adds: read-only, at the token's path, of a
/// `kube-api-access-*` volume of the Pod that holds a ServiceAccount token, and nothing else
/// (a Pod author's own volume mounted there would hand the sidecar a token of their choice).
/// [`service_account_mount_cel`] is the same rule for the policies: keep the two together.
fn is_service_account_mount(mount: &Value, pod: &Surroundings<'_>) -> bool {
    let Some(mount) = mount.as_object() else {
        return false;
    };
    let name = mount
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    mount.len() == 3
        && mount.get("mountPath").and_then(Value::as_str) == Some(SERVICE_ACCOUNT_MOUNT_PATH)
        && mount.get("readOnly") == Some(&Value::Bool(true))
        && name.starts_with(TOKEN_VOLUME_PREFIX)
        && pod.token_volumes.contains(&name)
}

/// [`is_service_account_mount`] as a CEL condition on the mount `mount` of a container of
/// `object`, the Pod under admission (its token volumes are those `holds_service_account_token`
/// accepts). Only the name prefix was checked once, and an `emptyDir` named `kube-api-access-x`,
/// which the ServiceAccount plugin itself then mounts at the token's path, passed for the
/// token's volume in the policies, where the webhook refused it.
pub(crate) fn service_account_mount_cel(mount: &str) -> String {
    // The name first: it tells the template's own mounts from the token's at once.
    format!(
        "({mount}.?name.orValue(\"\").startsWith({prefix}) \
         && {mount}.?mountPath.orValue(\"\") == {path} \
         && {mount}.?readOnly.orValue(false) == true \
         && size({mount}) == 3 \
         && object.spec.?volumes.orValue([]).exists(v, v.name == {mount}.name \
         && v.?projected.?sources.orValue([]).exists(s, has(s.serviceAccountToken))))",
        path = cel_string(SERVICE_ACCOUNT_MOUNT_PATH),
        prefix = cel_string(TOKEN_VOLUME_PREFIX),
    )
}

/// What `difference` allows written once as CEL for its two CEL forms, which start from
/// different inputs ([`container_presence`] from the container as the API server stored it,
/// [`holds_cel`] from the template's own): a pull policy, `field` (a CEL expression), equal to
/// `value` or `Always`, which the AlwaysPullImages admission plugin, where enabled, sets
/// whatever the template says.
pub(crate) fn pull_policy_cel(field: &str, value: &str) -> String {
    format!("({field} == {value} || {field} == \"Always\")")
}

/// The mounts of `container` (a CEL expression) but the ServiceAccount token's, which the
/// plugin may add anywhere among the template's (`is_service_account_mount`).
pub(crate) fn mounts_but_token_cel(container: &str) -> String {
    format!(
        "{container}.?volumeMounts.orValue([]).filter(m, !{})",
        service_account_mount_cel("m")
    )
}

/// The field `key` of `object` (a CEL expression) holding `text`, a string a placeholder
/// renders: rendered empty, the field is left out (the API server drops most empty strings)
/// or kept empty.
pub(crate) fn rendered_text_cel(object: &str, key: &str, text: &str) -> String {
    format!("{object}[?{}].orValue(\"\") == {text}", cel_string(key))
}

/// Whether `object`, the Pod under admission, is on the host network, where the API server
/// gives each port a `hostPort` (`is_filled_in`).
pub(crate) const HOST_NETWORK_CEL: &str = "object.spec.?hostNetwork.orValue(false)";

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::String(text) => text.is_empty(),
        _ => false,
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() || key.is_empty() {
        format!("{path}{key}")
    } else {
        format!("{path}.{key}")
    }
}

fn object_difference(
    ours: &Map<String, Value>,
    theirs: &Map<String, Value>,
    context: Context,
    path: &str,
    pod: &Surroundings<'_>,
) -> Option<String> {
    for (key, value) in ours {
        let child = child_context(context, key);
        let found = match theirs.get(key) {
            Some(found) => found,
            // A key the template sets to nothing may be left out, and so may a zero value
            // the API server drops.
            None if is_empty(value) || is_dropped_zero(context, key, value) => continue,
            None => return Some(join(path, key)),
        };
        if is_defaulted_zero(context, key, value, found)
            // A zero the API server drops is a key left out, which it may then fill in: a
            // hostNetwork Pod's `hostPort: 0` is stored as its `containerPort`.
            || (is_dropped_zero(context, key, value) && is_filled_in(context, key, found, ours, pod))
            // The AlwaysPullImages admission plugin, where enabled, overrides any policy.
            || (context == Context::Container && key == "imagePullPolicy" && found == "Always")
        {
            continue;
        }
        if context == Context::Container && key == "volumeMounts" {
            if let Some(difference) = mounts_difference(value, found, &join(path, key), pod) {
                return Some(difference);
            }
            continue;
        }
        if let Some(difference) = value_difference(value, found, child, path, key, pod) {
            return Some(difference);
        }
    }
    theirs
        .iter()
        .find(|(key, value)| {
            !ours.contains_key(*key) && !is_filled_in(context, key, value, ours, pod)
        })
        .map(|(key, _)| join(path, key))
}

/// The difference between `ours` and `theirs`, the values of `key` in an object at `parent`;
/// the path is built only when they differ.
fn value_difference(
    ours: &Value,
    theirs: &Value,
    context: Context,
    parent: &str,
    key: &str,
    pod: &Surroundings<'_>,
) -> Option<String> {
    let here = || join(parent, key);
    match (ours, theirs) {
        (Value::Object(ours), Value::Object(theirs)) => {
            object_difference(ours, theirs, context, &here(), pod)
        }
        (Value::Array(ours), Value::Array(theirs)) => {
            if ours.len() != theirs.len() {
                return Some(here());
            }
            let position = ours.iter().zip(theirs).position(|(a, b)| a != b)?;
            let base = here();
            ours.iter()
                .zip(theirs)
                .enumerate()
                .skip(position)
                .find_map(|(i, (a, b))| {
                    item_difference(a, b, context, &format!("{base}[{i}]"), pod)
                })
        }
        (Value::String(a), Value::String(b))
            if matches!(context, Context::Resources | Context::Quantities) =>
        {
            (!same_quantity(a, b)).then(here)
        }
        _ => (ours != theirs).then(here),
    }
}

/// The difference between two items of a list, at `path`.
fn item_difference(
    ours: &Value,
    theirs: &Value,
    context: Context,
    path: &str,
    pod: &Surroundings<'_>,
) -> Option<String> {
    match (ours, theirs) {
        (Value::Object(ours), Value::Object(theirs)) => {
            object_difference(ours, theirs, context, path, pod)
        }
        _ => value_difference(ours, theirs, context, path, "", pod),
    }
}

/// The container's mounts: the template's, in order, with the ServiceAccount token's mount
/// allowed anywhere among them.
fn mounts_difference(
    ours: &Value,
    theirs: &Value,
    path: &str,
    pod: &Surroundings<'_>,
) -> Option<String> {
    let (Some(ours), Some(theirs)) = (ours.as_array(), theirs.as_array()) else {
        return (ours != theirs).then(|| path.to_owned());
    };
    let theirs: Vec<&Value> = theirs
        .iter()
        .filter(|m| !is_service_account_mount(m, pod) || ours.contains(m))
        .collect();
    if ours.len() != theirs.len() {
        return Some(path.to_owned());
    }
    ours.iter()
        .zip(theirs)
        .enumerate()
        .find_map(|(i, (a, b))| item_difference(a, b, Context::Mount, &format!("{path}[{i}]"), pod))
}

/// Whether two resource quantities are the same amount. The API server rewrites quantities in
/// canonical form (`0.5` becomes `500m`, `1024Mi` becomes `1Gi`) and rounds them up to
/// thousandths.
fn same_quantity(a: &str, b: &str) -> bool {
    a == b || matches!((milli_units(a), milli_units(b)), (Some(x), Some(y)) if x == y)
}

/// A quantity (`100m`, `1.5Gi`, `1e3`) in thousandths, rounded up as the API server does;
/// `None` when it is not one or does not fit.
fn milli_units(quantity: &str) -> Option<i128> {
    let quantity = quantity.trim();
    let split = quantity
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(split);
    let (negative, number) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    // mantissa × 10^exponent10 × 2^exponent2, exactly.
    let mut mantissa: i128 = 0;
    for digit in whole.bytes().chain(fraction.bytes()) {
        mantissa = mantissa
            .checked_mul(10)?
            .checked_add(i128::from(digit - b'0'))?;
    }
    let mut exponent10 = -i32::try_from(fraction.len()).ok()?;
    let mut exponent2 = 0u32;
    match suffix {
        "" => {}
        "n" => exponent10 -= 9,
        "u" => exponent10 -= 6,
        "m" => exponent10 -= 3,
        "k" => exponent10 += 3,
        "M" => exponent10 += 6,
        "G" => exponent10 += 9,
        "T" => exponent10 += 12,
        "P" => exponent10 += 15,
        "E" => exponent10 += 18,
        "Ki" => exponent2 = 10,
        "Mi" => exponent2 = 20,
        "Gi" => exponent2 = 30,
        "Ti" => exponent2 = 40,
        "Pi" => exponent2 = 50,
        "Ei" => exponent2 = 60,
        other => {
            let exponent = other.strip_prefix(['e', 'E'])?.parse::<i32>().ok()?;
            exponent10 = exponent10.checked_add(exponent)?;
        }
    }
    // In thousandths: one more factor of 10^3.
    exponent10 = exponent10.checked_add(3)?;
    let mut value = mantissa.checked_mul(1i128.checked_shl(exponent2)?)?;
    if exponent10 >= 0 {
        value = value.checked_mul(10i128.checked_pow(u32::try_from(exponent10).ok()?)?)?;
    } else {
        let divisor = 10i128.checked_pow(u32::try_from(-exponent10).ok()?)?;
        value = value / divisor + i128::from(value % divisor != 0);
    }
    Some(if negative { -value } else { value })
}

mod holds;
mod present;
mod stored;
pub(crate) use holds::holds_cel;
pub(crate) use present::container_presence;
pub(crate) use stored::stored_volume;

#[cfg(test)]
mod tests;
