//! The names of the operator's objects (its Service, webhook configuration, Secret, Lease,
//! policy), as the operator runs with them: the flags and environment of `run` in its
//! Deployment's container, parsed by the operator's own parser ([`RunArgs::of_process`]), so
//! that a chart's `nameOverride` or `fullnameOverride`, or a flag set by hand, is followed and
//! no default is restated here. Computed from the release's name only when the Deployment
//! cannot be read, and then said to be assumed.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Container;

use super::{CHART_NAME, Read};
use crate::args::RunArgs;

/// The longest full name the chart makes (so that `<fullname>-leader` stays a valid name).
const FULLNAME_MAX: usize = 52;

/// Where the names come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The operator's Deployment: what its container runs with.
    Deployment,
    /// Computed from the release's name, as the chart names its objects by default: the
    /// Deployment could not be read, for this reason.
    Assumed(String),
}

/// The names of one installation's objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    /// The operator's namespace (`--namespace`): its Deployment, Service, Secret and Lease.
    pub namespace: String,
    /// The operator's Deployment (and its NetworkPolicy, by the chart).
    pub deployment: String,
    /// The Service in front of the webhook (`--service-name`).
    pub service: String,
    /// The MutatingWebhookConfiguration (`--webhook-config-name`).
    pub webhook_configuration: String,
    /// The certificate Secret (`--secret-name`).
    pub secret: String,
    /// The leader-election Lease (`--lease-name`).
    pub lease: String,
    /// The MutatingAdmissionPolicy and its binding (`--policy-name`).
    pub policy: String,
    /// Where these names come from.
    pub source: Source,
}

impl Names {
    /// The names the chart gives a release `release` in `namespace` (its `fullname` helper:
    /// the release's name when it contains the chart's, else `<release>-sidecar-injector`, cut
    /// at 52 characters), or `fullname` as given (its `fullnameOverride`): assumed, until
    /// [`operator_names`] reads the Deployment.
    pub fn of_release(namespace: &str, release: &str, fullname: Option<&str>) -> Self {
        let full = match fullname {
            Some(fullname) => fullname.to_owned(),
            None if release.contains(CHART_NAME) => release.to_owned(),
            None => format!("{release}-{CHART_NAME}"),
        };
        let cut: String = full.chars().take(FULLNAME_MAX).collect();
        let full = cut.trim_end_matches('-').to_owned();
        Names {
            namespace: namespace.to_owned(),
            deployment: full.clone(),
            service: full.clone(),
            webhook_configuration: full.clone(),
            secret: format!("{full}-tls"),
            lease: format!("{full}-leader"),
            policy: full,
            source: Source::Assumed("the operator's Deployment was not read".to_owned()),
        }
    }

    /// The policy backend's guard (`--injection-backend policy`), named after the policy.
    pub fn guard(&self) -> String {
        injector_core::policy::guard_name(&self.policy)
    }

    /// The name the API server checks the webhook's certificate for, through the Service.
    pub fn service_host(&self) -> String {
        format!("{}.{}.svc", self.service, self.namespace)
    }

    /// `deployment/NAME -n NAMESPACE`.
    pub fn deployment_ref(&self) -> String {
        format!("deployment/{} -n {}", self.deployment, self.namespace)
    }
}

/// The names the operator runs with, from its Deployment as read; `assumed` (saying why)
/// when it was not found, could not be read, or its arguments cannot be parsed.
pub fn operator_names(deployment: &Read<Deployment>, assumed: Names) -> Names {
    let what = assumed.deployment_ref();
    let why = match deployment {
        Read::Found(found) => match of_deployment(found) {
            Ok(names) => return names,
            Err(why) => format!("{what}: {why}"),
        },
        Read::Missing => format!("{what} not found"),
        Read::Forbidden(_) | Read::Failed(_) => deployment.unread(&what).unwrap_or_default(),
    };
    Names {
        source: Source::Assumed(why),
        ..assumed
    }
}

/// Whether `deployment` runs the operator (a container runs `run`).
pub fn runs_operator(deployment: &Deployment) -> bool {
    operator_container(deployment).is_some()
}

/// The names `deployment`'s operator container runs with; why not, when it has none or its
/// arguments do not parse.
fn of_deployment(deployment: &Deployment) -> Result<Names, String> {
    let name = deployment.metadata.name.clone().unwrap_or_default();
    let namespace = deployment.metadata.namespace.clone().unwrap_or_default();
    let (container, argv) = operator_container(deployment)
        .ok_or_else(|| "no container runs `sidecar-injector run`".to_owned())?;
    let env = literal_env(container, &namespace);
    let argv: Vec<String> = argv.iter().map(|arg| expand(arg, &env)).collect();
    let options = RunArgs::of_process(&argv, &env, &namespace).map_err(|e| {
        format!(
            "the arguments of container {} do not parse: {}",
            container.name,
            e.to_string().lines().next().unwrap_or_default()
        )
    })?;
    Ok(Names {
        namespace: options.namespace,
        deployment: name,
        service: options.service_name,
        webhook_configuration: options.webhook_config_name,
        secret: options.secret_name,
        lease: options.lease_name,
        policy: options.policy_name,
        source: Source::Deployment,
    })
}

/// The first container of `deployment` whose command line holds `run`, and what follows it.
fn operator_container(deployment: &Deployment) -> Option<(&Container, Vec<String>)> {
    let spec = deployment.spec.as_ref()?.template.spec.as_ref()?;
    spec.containers.iter().find_map(|container| {
        let line: Vec<&String> = container
            .command
            .iter()
            .flatten()
            .chain(container.args.iter().flatten())
            .collect();
        let at = line.iter().position(|arg| *arg == "run")?;
        Some((
            container,
            line[at + 1..].iter().map(|a| (*a).clone()).collect(),
        ))
    })
}

/// The container's variables whose value is known without the cluster: literal values (with
/// the earlier ones expanded, as the kubelet does) and the Pod's namespace, which is
/// `namespace`. Others (from Secrets, ConfigMaps, other fields) are left out, so that their
/// references stay as written.
fn literal_env(container: &Container, namespace: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for var in container.env.iter().flatten() {
        let field = var
            .value_from
            .as_ref()
            .and_then(|from| from.field_ref.as_ref())
            .map(|field| field.field_path.as_str());
        let value = match (&var.value, field) {
            (Some(value), _) => expand(value, &env),
            (None, Some("metadata.namespace")) => namespace.to_owned(),
            // An unset value is the empty string.
            (None, None) if var.value_from.is_none() => String::new(),
            _ => continue,
        };
        env.insert(var.name.clone(), value);
    }
    env
}

/// `text` with `$(NAME)` replaced by `NAME`'s value in `env` and `$$` by `$`, as the kubelet
/// expands a container's arguments; a reference to an unknown variable stays as written.
fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
            continue;
        }
        let reference = after
            .strip_prefix('(')
            .and_then(|inner| inner.split_once(')'))
            .and_then(|(name, tail)| Some((env.get(name)?, tail)));
        match reference {
            Some((value, tail)) => {
                out.push_str(value);
                rest = tail;
            }
            None => {
                out.push('$');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests;
