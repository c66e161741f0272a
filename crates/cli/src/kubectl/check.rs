//! `kubectl sidecar check`, without I/O: each link of the live plumbing between the API server
//! and an injected Pod judged from what was read ([`Observed`], read by [`super::plumbing`]),
//! one line each: ok, or broken with why and what to do.
//!
//! The links: the operator's Deployment, its leader (the Lease), the MutatingWebhookConfiguration
//! (found, its entries calling the operator's Service, one for every group of templates in
//! force but those the operator left out for room),
//! its caBundle (verifying the certificate the webhook serves, or the Secret's), the Service's
//! ready endpoints, the NetworkPolicy in front of the webhook, the policy backend, the templates'
//! `Ready`; and for a namespace or a Pod, which templates select it, whether it opts out, and
//! whether Pods carry what the templates in force inject. Every rule of selection and of where
//! a Pod stands is the operator's own (`injector_core::plan`, `injector_core::after_admission::lifecycle`), and
//! so is which groups have no entry (`injector_controller::webhook_config::left_out`): never
//! restated here.
//!
//! The objects are named as the operator runs with them, read from its Deployment
//! ([`operator_names`]), and the first line says so, or that they are assumed.
//!
//! A read that failed (forbidden, say) costs its links only: they say what could not be read,
//! and the others are still judged. A link whose verdict depends on what could not be read is
//! `unknown`, never `ok`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use injector_api::SidecarTemplate;
use injector_api::names::{INJECT_ANNOTATION, INJECTED_ANNOTATION};
use injector_controller::certs::{CA_CERT_KEY, CLOCK_SKEW_ALLOWANCE, TLS_CERT_KEY};
use injector_controller::status::{POLICY_SERVED, READY, REASON_NOT_SERVED};
use injector_controller::webhook_config::{entry_name, left_out};
use injector_core::after_admission::lifecycle::{PodMeta, PodState, recorded, selects, standing};
use injector_core::rules::selection::{opts_out, pod_wide_skip};
use injector_core::{CompiledTemplate, NamespaceInfo, Selector, Snapshot};
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use super::table::Table;

mod certificate;
mod names;

pub use certificate::verify_chain;
pub use names::{Names, Source, operator_names, runs_operator};

/// The chart's name, which its objects' names derive from.
const CHART_NAME: &str = "sidecar-injector";

/// What one read gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read<T> {
    /// The object (or list).
    Found(T),
    /// It does not exist (or its kind is not served).
    Missing,
    /// The user may not read it: the API server's message.
    Forbidden(String),
    /// The call failed otherwise.
    Failed(String),
}

impl<T> Read<T> {
    /// The object, when found.
    pub fn found(&self) -> Option<&T> {
        match self {
            Read::Found(value) => Some(value),
            _ => None,
        }
    }

    /// Whether it is known not to exist.
    pub fn is_missing(&self) -> bool {
        matches!(self, Read::Missing)
    }

    /// What `f` makes of the object, when found; the rest as it is.
    pub fn and_then<U>(self, f: impl FnOnce(T) -> Read<U>) -> Read<U> {
        match self {
            Read::Found(value) => f(value),
            Read::Missing => Read::Missing,
            Read::Forbidden(message) => Read::Forbidden(message),
            Read::Failed(message) => Read::Failed(message),
        }
    }

    /// Whether it could not be read (forbidden, or the call failed).
    fn is_unread(&self) -> bool {
        matches!(self, Read::Forbidden(_) | Read::Failed(_))
    }

    /// Why `what` is not known, when it was neither found nor found missing.
    fn unread(&self, what: &str) -> Option<String> {
        match self {
            Read::Forbidden(message) => Some(format!("cannot read {what}: forbidden ({message})")),
            Read::Failed(message) => Some(format!("cannot read {what}: {message}")),
            Read::Found(_) | Read::Missing => None,
        }
    }
}

/// What a TLS handshake with the webhook's URL gave (an operator out of cluster).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// The URL the entries call.
    pub url: String,
    /// The host the certificate must name.
    pub host: String,
    /// The certificate chain served (DER, the leaf first), or why none was.
    pub served: Result<Vec<Vec<u8>>, String>,
}

/// A namespace or a Pod to check, as read.
#[derive(Clone, Debug)]
pub enum Target {
    /// A namespace: which templates select it, and where its Pods stand.
    Namespace {
        /// Its name.
        name: String,
        /// Its labels.
        labels: Read<BTreeMap<String, String>>,
        /// Its Pods' metadata.
        pods: Read<Vec<ObjectMeta>>,
    },
    /// A Pod: which templates select it, and whether it carries what they inject.
    Pod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The namespace's labels.
        labels: Read<BTreeMap<String, String>>,
        /// Its metadata.
        pod: Read<Box<ObjectMeta>>,
    },
}

/// Everything `check` read.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The operator's Deployment.
    pub deployment: Read<Deployment>,
    /// The leader-election Lease.
    pub lease: Read<Lease>,
    /// The MutatingWebhookConfiguration.
    pub configuration: Read<MutatingWebhookConfiguration>,
    /// The operator's Service.
    pub service: Read<Service>,
    /// The Service's EndpointSlices.
    pub slices: Read<Vec<EndpointSlice>>,
    /// The certificate Secret.
    pub secret: Read<Secret>,
    /// The handshake with the webhook's URL, when the entries call one.
    pub handshake: Option<Handshake>,
    /// The handshake with a ready endpoint of the Service, when the entries call it (asking
    /// for the Service's name); its error when the address cannot be reached from here.
    pub endpoint_handshake: Option<Handshake>,
    /// The NetworkPolicies of the operator's namespace.
    pub network_policies: Read<Vec<NetworkPolicy>>,
    /// The MutatingAdmissionPolicy (presence only).
    pub policy: Read<()>,
    /// Its binding (presence only).
    pub policy_binding: Read<()>,
    /// The guard ValidatingAdmissionPolicy of `--injection-backend policy` (presence only).
    pub guard: Read<()>,
    /// Every SidecarTemplate.
    pub templates: Read<Vec<SidecarTemplate>>,
    /// The namespace or Pod asked about.
    pub target: Option<Target>,
}

/// How a link stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// It works.
    Ok,
    /// Not in use here.
    Skipped,
    /// It may not work, and cannot be proven from here; or it works only in part.
    Warning,
    /// It could not be read.
    Unknown,
    /// It does not work: the message says why and what to do.
    Broken,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::Ok => "ok",
            State::Skipped => "skipped",
            State::Warning => "warning",
            State::Unknown => "unknown",
            State::Broken => "broken",
        })
    }
}

/// One link of the plumbing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Link {
    /// Which link.
    pub link: &'static str,
    /// How it stands.
    pub state: State,
    /// What was found; when broken, why and what to do.
    pub message: String,
}

fn link(link: &'static str, state: State, message: impl Into<String>) -> Link {
    Link {
        link,
        state,
        message: message.into(),
    }
}

/// Every link, in the order a call goes through them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The links.
    pub links: Vec<Link>,
    /// Whether a link is broken (the command then exits with 4).
    pub broken: bool,
}

/// Where the API server calls the webhook, as the configuration says.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Calls {
    /// Through the operator's Service (in a cluster).
    Service,
    /// At a URL (an operator out of cluster).
    Url(String),
    /// Not known: no configuration, or one without entries.
    Unknown,
    /// Not known: the configuration cannot be read.
    Unread,
}

/// The templates as the operator keeps them: in force, and their conditions.
struct Templates<'a> {
    listed: &'a [SidecarTemplate],
    in_force: Arc<Snapshot>,
    /// Why they are not known, when they could not be read.
    unread: Option<String>,
}

impl Templates<'_> {
    fn condition(&self, name: &str, kind: &str) -> Option<&Condition> {
        self.listed
            .iter()
            .find(|t| t.metadata.name.as_deref() == Some(name))
            .and_then(|t| t.status.as_ref())
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == kind))
    }

    fn ready(&self, name: &str) -> bool {
        self.condition(name, READY)
            .is_some_and(|c| c.status == "True")
    }
}

/// Judges every link from `observed`, for the installation `names`, at `now`.
pub fn judge(observed: &Observed, names: &Names, now: Timestamp) -> Report {
    let listed: &[SidecarTemplate] = observed.templates.found().map_or(&[], Vec::as_slice);
    let (in_force, _) = injector_core::registry::in_force::from_listing(listed.iter().cloned());
    let templates = Templates {
        listed,
        in_force,
        unread: observed.templates.unread("sidecartemplates"),
    };
    let calls = calls(&observed.configuration);
    let mut links = vec![
        names_link(names, &observed.deployment),
        operator(observed, names, &calls),
        leader(&observed.lease, names, now),
        configuration(observed, names, &templates),
        ca_bundle(observed, names, now),
        endpoints(observed, names, &calls),
        network_policy(observed, names, &calls),
        policy_backend(observed, names, &templates),
        templates_ready(&observed.templates, &templates),
    ];
    match &observed.target {
        None => {}
        Some(Target::Namespace { name, labels, pods }) => {
            links.push(namespace(name, labels, names, &templates));
            links.push(namespace_pods(name, labels, pods, names, &templates));
        }
        Some(Target::Pod {
            namespace: ns,
            name,
            labels,
            pod,
        }) => {
            links.push(namespace(ns, labels, names, &templates));
            links.extend(pod_links(ns, name, labels, pod, names, &templates));
        }
    }
    let broken = links.iter().any(|l| l.state == State::Broken);
    Report { links, broken }
}

/// The namespace or Pod asked about, when it does not exist (`namespace/NAME`, `pod/NAME -n
/// NAMESPACE`): a mistyped name is an error of the command, not a link of the plumbing.
pub fn absent_target(observed: &Observed) -> Option<String> {
    match observed.target.as_ref()? {
        Target::Namespace { name, labels, .. } => {
            labels.is_missing().then(|| format!("namespace/{name}"))
        }
        Target::Pod {
            namespace,
            name,
            labels,
            pod,
        } => {
            if labels.is_missing() {
                Some(format!("namespace/{namespace}"))
            } else {
                pod.is_missing()
                    .then(|| format!("pod/{name} -n {namespace}"))
            }
        }
    }
}

fn calls(configuration: &Read<MutatingWebhookConfiguration>) -> Calls {
    if configuration.is_unread() {
        return Calls::Unread;
    }
    let first = configuration
        .found()
        .and_then(|c| c.webhooks.as_ref())
        .and_then(|w| w.first());
    match first.map(|w| &w.client_config) {
        Some(client) => match (&client.url, &client.service) {
            (Some(url), _) => Calls::Url(base_url(url)),
            (None, Some(_)) => Calls::Service,
            (None, None) => Calls::Unknown,
        },
        None => Calls::Unknown,
    }
}

/// `https://host:port` of an entry's URL (`…/mutate/<group>`).
fn base_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let authority = rest.split('/').next().unwrap_or_default();
            format!("{scheme}://{authority}")
        }
        None => url.to_owned(),
    }
}

const NAMES: &str = "names";
const OPERATOR: &str = "operator";
const LEADER: &str = "leader";
const CONFIGURATION: &str = "webhook configuration";
const CA_BUNDLE: &str = "ca bundle";
const ENDPOINTS: &str = "endpoints";
const NETWORK_POLICY: &str = "network policy";
const POLICY_BACKEND: &str = "policy backend";
const TEMPLATES: &str = "templates";
const NAMESPACE: &str = "namespace";
const PODS: &str = "pods";
const SELECTION: &str = "selection";
const RECORD: &str = "record";

/// Which objects the other links read, and where their names come from: when they are
/// assumed, a warning (unknown when the Deployment could not be read), as an installation
/// named otherwise would look missing link by link.
fn names_link(names: &Names, deployment: &Read<Deployment>) -> Link {
    let objects = format!(
        "service/{}, mutatingwebhookconfiguration/{}, secret/{}, lease/{}, mutatingadmissionpolicy/{} in {}",
        names.service,
        names.webhook_configuration,
        names.secret,
        names.lease,
        names.policy,
        names.namespace
    );
    match &names.source {
        Source::Deployment => link(
            NAMES,
            State::Ok,
            format!("{objects}, as {} runs with them", names.deployment_ref()),
        ),
        Source::Assumed(why) => link(
            NAMES,
            if deployment.is_unread() {
                State::Unknown
            } else {
                State::Warning
            },
            format!(
                "{why}: assumed from the release's name: {objects}; an installation with the chart's nameOverride or fullnameOverride needs --release and --fullname as installed"
            ),
        ),
    }
}

fn operator(observed: &Observed, names: &Names, calls: &Calls) -> Link {
    let what = names.deployment_ref();
    if let Some(why) = observed.deployment.unread(&what) {
        return link(OPERATOR, State::Unknown, why);
    }
    let Some(deployment) = observed.deployment.found() else {
        return match calls {
            Calls::Url(url) => link(
                OPERATOR,
                State::Skipped,
                format!(
                    "{what} not found: the webhook configuration calls {url}, an operator out of the cluster"
                ),
            ),
            // Maybe out of the cluster: only the configuration would tell.
            Calls::Unread => link(
                OPERATOR,
                State::Unknown,
                format!(
                    "{what} not found, and the webhook configuration cannot be read to tell whether the operator runs out of the cluster"
                ),
            ),
            Calls::Service | Calls::Unknown => link(
                OPERATOR,
                State::Broken,
                format!(
                    "{what} not found: no operator runs; install the chart (or pass the release's --release/--fullname and --operator-namespace)"
                ),
            ),
        };
    };
    let wanted = deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let status = deployment.status.as_ref();
    let ready = status.and_then(|s| s.ready_replicas).unwrap_or(0);
    let updated = status.and_then(|s| s.updated_replicas).unwrap_or(0);
    if ready == 0 {
        return link(
            OPERATOR,
            State::Broken,
            format!(
                "{what}: 0/{wanted} replicas ready: the API server has no webhook to call (required templates' Pods are refused); `kubectl -n {} describe pods -l app.kubernetes.io/name={CHART_NAME}` and the replicas' /readyz say why",
                names.namespace
            ),
        );
    }
    let message = format!("{what}: {ready}/{wanted} replicas ready, {updated} up to date");
    if ready < wanted {
        link(OPERATOR, State::Warning, message)
    } else {
        link(OPERATOR, State::Ok, message)
    }
}

fn leader(lease: &Read<Lease>, names: &Names, now: Timestamp) -> Link {
    let what = format!("lease/{} -n {}", names.lease, names.namespace);
    if let Some(why) = lease.unread(&what) {
        return link(LEADER, State::Unknown, why);
    }
    let no_leader = "no leader: the webhook still answers, but nobody keeps the webhook configuration, the certificates and the templates' status; the operator's log says why it cannot take the Lease (RBAC on it?)";
    let Some(spec) = lease.found().and_then(|l| l.spec.as_ref()) else {
        return link(
            LEADER,
            State::Broken,
            format!("{what} not found: {no_leader}"),
        );
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return link(
            LEADER,
            State::Broken,
            format!("{what} is held by nobody: {no_leader}"),
        );
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let Some(renewed) = spec.renew_time.as_ref().map(|t| t.0) else {
        return link(
            LEADER,
            State::Warning,
            format!("{what} held by {holder}, never renewed"),
        );
    };
    let ago = now.as_second().saturating_sub(renewed.as_second());
    if ago > duration {
        return expired(&what, holder, ago, duration);
    }
    link(
        LEADER,
        State::Ok,
        format!("{what} held by {holder}, renewed {}s ago", ago.max(0)),
    )
}

/// A Lease last renewed `ago` seconds ago by this machine's clock, past its `duration`: the
/// leader is gone, unless this machine's clock is ahead of the cluster's, which the
/// certificates' allowance for skew ([`CLOCK_SKEW_ALLOWANCE`]) bounds: within it, a warning.
fn expired(what: &str, holder: &str, ago: i64, duration: i64) -> Link {
    let skew = i64::try_from(CLOCK_SKEW_ALLOWANCE.as_secs()).unwrap_or(i64::MAX);
    let late = format!(
        "{what} held by {holder}, last renewed {ago}s ago, past its {duration}s (by this machine's clock)"
    );
    if ago <= duration.saturating_add(skew) {
        return link(
            LEADER,
            State::Warning,
            format!(
                "{late}, but within the {skew}s this machine's clock may run ahead of the cluster's: the leader may be gone, or the clock is off; check again, and compare `date -u` with the Lease's renewTime"
            ),
        );
    }
    link(
        LEADER,
        State::Broken,
        format!(
            "{late}: the leader is gone, and no replica took over; are the operator's Pods running?"
        ),
    )
}

fn configuration(observed: &Observed, names: &Names, templates: &Templates<'_>) -> Link {
    let what = format!(
        "mutatingwebhookconfiguration/{}",
        names.webhook_configuration
    );
    if let Some(why) = observed.configuration.unread(&what) {
        return link(CONFIGURATION, State::Unknown, why);
    }
    let Some(configuration) = observed.configuration.found() else {
        return link(
            CONFIGURATION,
            State::Broken,
            format!(
                "{what} not found: the API server calls no webhook; the leader writes it again within seconds, else see the leader link"
            ),
        );
    };
    let entries = configuration.webhooks.as_deref().unwrap_or_default();
    let mut problems = misdirected_entries(entries, observed, names);
    let absent = absent_entries(configuration, observed, names, templates);
    if let Ok(Some(absent)) = &absent {
        problems.push(absent.clone());
    }
    if !problems.is_empty() {
        return link(
            CONFIGURATION,
            State::Broken,
            format!("{what}: {}", problems.join("; ")),
        );
    }
    let summary = format!(
        "{what}: {}{}",
        counted(entries.len(), "entry", "entries"),
        calling(entries, observed.guard.found().is_some())
    );
    match absent {
        Err(why) => link(
            CONFIGURATION,
            State::Unknown,
            format!("{summary}; whether every template in force has its entry is not known: {why}"),
        ),
        Ok(_) => link(CONFIGURATION, State::Ok, summary),
    }
}

/// The entries that do not call the operator's Service (its namespace, name and one of its
/// ports), or call nothing.
fn misdirected_entries(
    entries: &[MutatingWebhook],
    observed: &Observed,
    names: &Names,
) -> Vec<String> {
    let ports: Option<Vec<i32>> = observed.service.found().map(|s| {
        s.spec
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .map(|p| p.port)
            .collect()
    });
    entries
        .iter()
        .filter_map(|entry| {
            let client = &entry.client_config;
            let Some(service) = &client.service else {
                return client
                    .url
                    .is_none()
                    .then(|| format!("entry {} names neither a service nor a URL", entry.name));
            };
            if service.namespace != names.namespace || service.name != names.service {
                return Some(format!(
                    "entry {} calls service {}/{}, not {}/{}",
                    entry.name, service.namespace, service.name, names.namespace, names.service
                ));
            }
            let port = service.port.unwrap_or(443);
            let ports = ports.as_ref()?;
            (!ports.contains(&port)).then(|| {
                format!(
                    "entry {} calls port {port} of service {}/{}, which has ports {ports:?}",
                    entry.name, names.namespace, names.service
                )
            })
        })
        .collect()
}

/// The groups of templates in force that have no entry while the leader would give them
/// one, by the controller's own rule ([`left_out`]): every group has its entry, but those the
/// controller left out for room (their templates say `NotServed`), and none with the policy
/// backend alone (its guard in force). Why it is not known, when the templates or the guard
/// cannot be read.
fn absent_entries(
    configuration: &MutatingWebhookConfiguration,
    observed: &Observed,
    names: &Names,
    templates: &Templates<'_>,
) -> Result<Option<String>, String> {
    if let Some(why) = &templates.unread {
        return Err(why.clone());
    }
    let guard = format!("validatingadmissionpolicy/{}", names.guard());
    if let Some(why) = observed.guard.unread(&guard) {
        return Err(format!(
            "{why} (with it, the policy backend alone injects, and no entry is wanted)"
        ));
    }
    if observed.guard.found().is_some() {
        return Ok(None);
    }
    let absent: Vec<String> = left_out(&templates.in_force, configuration)
        .into_iter()
        .filter(|group| {
            !group.templates.iter().all(|t| {
                templates
                    .condition(&t.name, READY)
                    .is_some_and(|c| c.reason == REASON_NOT_SERVED)
            })
        })
        .map(|group| {
            let names: Vec<&str> = group.templates.iter().map(|t| t.name.as_str()).collect();
            format!("{} (templates {})", entry_name(&group.id), names.join(", "))
        })
        .collect();
    Ok((!absent.is_empty()).then(|| {
        format!(
            "no entry {}: the API server does not call the webhook for their Pods; the leader adds it within seconds, else see the leader link",
            absent.join("; ")
        )
    }))
}

/// What the entries call, for the configuration's line.
fn calling(entries: &[MutatingWebhook], policy_only: bool) -> String {
    match entries.first().map(|e| &e.client_config) {
        Some(client) => match (&client.service, &client.url) {
            (Some(s), _) => format!(
                ", each calling service {}/{}:{}",
                s.namespace,
                s.name,
                s.port.unwrap_or(443)
            ),
            (None, Some(url)) => format!(", each calling {}", base_url(url)),
            (None, None) => String::new(),
        },
        None if policy_only => ": the policy backend alone injects (no webhook)".to_owned(),
        None => String::new(),
    }
}

fn ca_bundle(observed: &Observed, names: &Names, now: Timestamp) -> Link {
    let roots = match bundle_roots(observed, names) {
        Ok(roots) => roots,
        Err(judged) => return judged,
    };
    if let Some(handshake) = &observed.handshake {
        return match &handshake.served {
            Ok(chain) => verified(handshake, "", chain, &roots, now),
            Err(_) => link(
                CA_BUNDLE,
                State::Unknown,
                format!(
                    "not verified: no certificate was served at {} (see endpoints)",
                    handshake.url
                ),
            ),
        };
    }
    // Through the Service: what a replica serves, when its address can be reached from here.
    if let Some(handshake) = &observed.endpoint_handshake
        && let Ok(chain) = &handshake.served
    {
        return verified(handshake, ", a replica's address", chain, &roots, now);
    }
    let unreachable = match &observed.endpoint_handshake {
        Some(Handshake {
            url,
            served: Err(why),
            ..
        }) => format!(" (a replica's address, {url}, cannot be reached from here: {why})"),
        _ => String::new(),
    };
    secret_verified(observed, names, &roots, now, &unreachable)
}

/// What to do about a caBundle that does not verify the webhook's certificate.
const CA_FIX: &str = "the leader writes the Secret's CA into the caBundle within a minute; if it does not, see the leader link";

/// The certificates of the caBundle every entry carries, or the link's line when there is
/// none to verify with: not read, no configuration or entry, entries that differ, or no PEM.
fn bundle_roots(observed: &Observed, names: &Names) -> Result<Vec<Vec<u8>>, Link> {
    let what = format!(
        "mutatingwebhookconfiguration/{}",
        names.webhook_configuration
    );
    if let Some(why) = observed.configuration.unread(&what) {
        return Err(link(CA_BUNDLE, State::Unknown, why));
    }
    let Some(configuration) = observed.configuration.found() else {
        return Err(link(
            CA_BUNDLE,
            State::Skipped,
            "no webhook configuration to read it from",
        ));
    };
    let entries = configuration.webhooks.as_deref().unwrap_or_default();
    let bundle_of = |entry: &MutatingWebhook| -> Vec<u8> {
        entry
            .client_config
            .ca_bundle
            .as_ref()
            .map(|b| b.0.clone())
            .unwrap_or_default()
    };
    let Some(bundle) = entries.first().map(bundle_of) else {
        return Err(link(
            CA_BUNDLE,
            State::Skipped,
            "the configuration has no entry",
        ));
    };
    if entries.iter().any(|e| bundle_of(e) != bundle) {
        return Err(link(
            CA_BUNDLE,
            State::Broken,
            "the entries carry different caBundles: some calls fail their TLS handshake; the leader writes one caBundle to every entry within a minute",
        ));
    }
    match certificate::pem_certificates(&bundle) {
        Ok(roots) if !roots.is_empty() => Ok(roots),
        Ok(_) => Err(link(
            CA_BUNDLE,
            State::Broken,
            "the entries carry no caBundle: the API server trusts only its own roots, which never signed the operator's certificate; the leader writes it within seconds",
        )),
        Err(why) => Err(link(
            CA_BUNDLE,
            State::Broken,
            format!("the caBundle is not PEM certificates: {why}"),
        )),
    }
}

/// Whether `roots` hold the CA of the operator's Secret and verify its serving certificate,
/// when no handshake fetched the one served (`unreachable`: why not, if one was tried).
fn secret_verified(
    observed: &Observed,
    names: &Names,
    roots: &[Vec<u8>],
    now: Timestamp,
    unreachable: &str,
) -> Link {
    // The replicas load this certificate (and reload it when it changes); that each serves
    // it now only a handshake with each would prove.
    let what = format!("secret/{} -n {}", names.secret, names.namespace);
    if let Some(why) = observed.secret.unread(&what) {
        return link(
            CA_BUNDLE,
            State::Unknown,
            format!(
                "{why}: the caBundle's {} certificates are not checked against it",
                roots.len()
            ),
        );
    }
    let Some(data) = observed.secret.found().and_then(|s| s.data.as_ref()) else {
        return link(
            CA_BUNDLE,
            State::Broken,
            format!(
                "{what} not found or empty: the replicas serve no certificate; the leader writes it within seconds, else see the leader link"
            ),
        );
    };
    // A key missing or not PEM reads as no certificate: the checks below say what that costs.
    let certificates = |key: &str| {
        let pem = data.get(key).map(|b| b.0.as_slice()).unwrap_or_default();
        certificate::pem_certificates(pem).unwrap_or_default()
    };
    let ca = certificates(CA_CERT_KEY);
    if ca.is_empty() || !ca.iter().all(|c| roots.contains(c)) {
        return link(
            CA_BUNDLE,
            State::Broken,
            format!(
                "does not hold the CA of {what} ({CA_CERT_KEY}): the API server's calls fail their TLS handshake; {CA_FIX}"
            ),
        );
    }
    let serving = certificates(TLS_CERT_KEY);
    let host = names.service_host();
    match verify_chain(&serving, roots, &host, now) {
        Ok(()) => link(
            CA_BUNDLE,
            State::Ok,
            format!(
                "holds the CA of {what} and verifies its serving certificate for {host}, the one the replicas load (not checked: that each serves it now){unreachable}"
            ),
        ),
        Err(why) => link(
            CA_BUNDLE,
            State::Broken,
            format!(
                "does not verify the serving certificate of {what} for {host}: {why}; {CA_FIX}"
            ),
        ),
    }
}

/// Whether `roots` verify `chain`, served at `handshake`'s URL (`whose`: what that URL is).
fn verified(
    handshake: &Handshake,
    whose: &str,
    chain: &[Vec<u8>],
    roots: &[Vec<u8>],
    now: Timestamp,
) -> Link {
    let Handshake { url, host, .. } = handshake;
    match verify_chain(chain, roots, host, now) {
        Ok(()) => link(
            CA_BUNDLE,
            State::Ok,
            format!(
                "verifies the certificate served at {url}{whose} (a TLS handshake, for {host})"
            ),
        ),
        Err(why) => link(
            CA_BUNDLE,
            State::Broken,
            format!(
                "does not verify the certificate served at {url}{whose}, for {host}: {why}; the API server's calls fail their TLS handshake; {CA_FIX}"
            ),
        ),
    }
}

fn endpoints(observed: &Observed, names: &Names, calls: &Calls) -> Link {
    if let (Calls::Url(url), Some(handshake)) = (calls, &observed.handshake) {
        return match &handshake.served {
            Ok(_) => link(
                ENDPOINTS,
                State::Ok,
                format!("{url} answers (TLS handshake)"),
            ),
            Err(why) => link(
                ENDPOINTS,
                State::Broken,
                format!("{url} cannot be reached: {why}; is the operator running?"),
            ),
        };
    }
    let what = format!("service/{} -n {}", names.service, names.namespace);
    if let Some(why) = observed.service.unread(&what) {
        return link(ENDPOINTS, State::Unknown, why);
    }
    if observed.service.is_missing() && *calls == Calls::Unread {
        return link(
            ENDPOINTS,
            State::Unknown,
            format!(
                "{what} not found, and the webhook configuration cannot be read to tell whether the webhook is called through it"
            ),
        );
    }
    if observed.service.is_missing() {
        return link(
            ENDPOINTS,
            State::Broken,
            format!(
                "{what} not found: the API server cannot call the webhook; the chart installs it"
            ),
        );
    }
    let slices = format!("the endpointslices of {what}");
    if let Some(why) = observed.slices.unread(&slices) {
        return link(ENDPOINTS, State::Unknown, why);
    }
    let all: Vec<_> = observed
        .slices
        .found()
        .into_iter()
        .flatten()
        .flat_map(|s| &s.endpoints)
        .collect();
    // An endpoint whose `ready` is unset counts as ready (the API's convention).
    let ready = all
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .count();
    if ready == 0 {
        return link(
            ENDPOINTS,
            State::Broken,
            format!(
                "{what} has no ready endpoint ({} not ready): the API server cannot call the webhook; a replica's /readyz says why it is not ready",
                all.len()
            ),
        );
    }
    link(
        ENDPOINTS,
        State::Ok,
        format!(
            "{what}: {}",
            counted(ready, "ready endpoint", "ready endpoints")
        ),
    )
}

fn network_policy(observed: &Observed, names: &Names, calls: &Calls) -> Link {
    if let Calls::Url(url) = calls {
        return link(
            NETWORK_POLICY,
            State::Skipped,
            format!("the webhook is called at {url}, not through the cluster's network"),
        );
    }
    let what = format!("networkpolicies -n {}", names.namespace);
    if let Some(why) = observed.network_policies.unread(&what) {
        return link(NETWORK_POLICY, State::Unknown, why);
    }
    let all: &[NetworkPolicy] = observed.network_policies.found().map_or(&[], Vec::as_slice);
    if all.is_empty() {
        return link(
            NETWORK_POLICY,
            State::Ok,
            format!("{what}: none, so nothing limits who reaches the webhook"),
        );
    }
    let (labels, port) = match operator_pods(observed, names) {
        Ok(found) => found,
        Err(why) => {
            return link(
                NETWORK_POLICY,
                State::Unknown,
                format!(
                    "{why}: which of the {} of {what} select the operator's Pods is not known",
                    counted(all.len(), "policy", "policies")
                ),
            );
        }
    };
    let policies: Vec<&NetworkPolicy> = all
        .iter()
        .filter(|np| selects_ingress(np, &labels))
        .collect();
    if policies.is_empty() {
        return link(
            NETWORK_POLICY,
            State::Ok,
            "none selects the operator's Pods: nothing limits who reaches the webhook",
        );
    }
    ingress_to(&policies, &port)
}

/// The operator's Pods' labels and the webhook's port: from the Deployment's Pod template,
/// else from the Service (its selector; the port's number is then not known, only its name).
/// Why they are not known, when neither could be read: an empty map would match every
/// policy whose selector is empty and no other, a guess either way.
fn operator_pods(
    observed: &Observed,
    names: &Names,
) -> Result<(BTreeMap<String, String>, WebhookPort), String> {
    let template = observed
        .deployment
        .found()
        .and_then(|d| d.spec.as_ref())
        .map(|s| &s.template);
    if let Some(labels) = template.and_then(|t| t.metadata.as_ref()?.labels.clone()) {
        let number = template
            .and_then(|t| t.spec.as_ref())
            .into_iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.ports.as_deref().unwrap_or_default())
            .find(|p| p.name.as_deref() == Some(WEBHOOK_PORT_NAME))
            .map(|p| p.container_port);
        return Ok((labels, WebhookPort::named(number)));
    }
    let selector = observed
        .service
        .found()
        .and_then(|s| s.spec.as_ref()?.selector.clone());
    if let Some(labels) = selector {
        return Ok((labels, WebhookPort::named(None)));
    }
    let deployment = names.deployment_ref();
    let service = format!("service/{} -n {}", names.service, names.namespace);
    Err(observed
        .deployment
        .unread(&deployment)
        .or_else(|| observed.service.unread(&service))
        .unwrap_or_else(|| {
            format!("neither {deployment} nor {service} says which Pods are the operator's")
        }))
}

/// How `policies`, which select the operator's Pods, let traffic reach `port`: any source
/// (ok), some peers only (a warning: whether the API server is among them cannot be proven
/// from here), or nothing (broken).
fn ingress_to(policies: &[&NetworkPolicy], port: &WebhookPort) -> Link {
    let mut from_peers = Vec::new();
    for np in policies {
        let name = np.metadata.name.as_deref().unwrap_or_default();
        let rules = np.spec.as_ref().and_then(|s| s.ingress.as_ref());
        for rule in rules.into_iter().flatten() {
            if !port.allowed_by(rule.ports.as_deref()) {
                continue;
            }
            match rule.from.as_deref() {
                None | Some([]) => {
                    return link(
                        NETWORK_POLICY,
                        State::Ok,
                        format!("networkpolicy/{name} lets any source reach {port}"),
                    );
                }
                Some(peers) => {
                    from_peers.push(format!("networkpolicy/{name} ({} peers)", peers.len()))
                }
            }
        }
    }
    if from_peers.is_empty() {
        let names: Vec<&str> = policies
            .iter()
            .filter_map(|np| np.metadata.name.as_deref())
            .collect();
        // A rule naming the port by number may be the one that lets it in.
        if port.number.is_none() {
            return link(
                NETWORK_POLICY,
                State::Unknown,
                format!(
                    "{} select the operator's Pods and no rule lets anything reach {port} by its name; its number is not known without the Deployment",
                    names.join(", ")
                ),
            );
        }
        return link(
            NETWORK_POLICY,
            State::Broken,
            format!(
                "{} select the operator's Pods and no rule lets anything reach {port}: the API server cannot call the webhook; allow it (the chart's networkPolicy.webhook.from)",
                names.join(", ")
            ),
        );
    }
    link(
        NETWORK_POLICY,
        State::Warning,
        format!(
            "only some sources may reach {port}: {}; the API server's address must be among them, which cannot be proven from here (it depends on the cluster; a managed one's firewall too)",
            from_peers.join(", ")
        ),
    )
}

/// The name the chart gives the webhook's container port.
const WEBHOOK_PORT_NAME: &str = "webhook";

/// The webhook's port, as NetworkPolicy rules may name it.
struct WebhookPort {
    number: Option<i32>,
    name: &'static str,
}

impl WebhookPort {
    fn named(number: Option<i32>) -> Self {
        WebhookPort {
            number,
            name: WEBHOOK_PORT_NAME,
        }
    }

    /// Whether a rule with `ports` lets traffic to this port in (no ports: every port).
    fn allowed_by(
        &self,
        ports: Option<&[k8s_openapi::api::networking::v1::NetworkPolicyPort]>,
    ) -> bool {
        let ports = ports.unwrap_or_default();
        ports.is_empty()
            || ports.iter().any(|p| {
                p.protocol.as_deref().unwrap_or("TCP") == "TCP"
                    && match &p.port {
                        None => true,
                        Some(IntOrString::String(name)) => name == self.name,
                        Some(IntOrString::Int(first)) => self.number.is_some_and(|n| {
                            n == *first || p.end_port.is_some_and(|end| (*first..=end).contains(&n))
                        }),
                    }
            })
    }
}

impl fmt::Display for WebhookPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.number {
            Some(n) => write!(f, "the webhook's port {n}"),
            None => write!(f, "the webhook's port ({:?})", self.name),
        }
    }
}

/// Whether `np` limits ingress to Pods with `labels`.
fn selects_ingress(np: &NetworkPolicy, labels: &BTreeMap<String, String>) -> bool {
    let Some(spec) = np.spec.as_ref() else {
        return false;
    };
    // Without policyTypes, a policy limits ingress (and egress only when it has egress rules).
    let ingress = spec
        .policy_types
        .as_ref()
        .is_none_or(|types| types.iter().any(|t| t == "Ingress"));
    ingress
        && Selector::compile(spec.pod_selector.as_ref(), "podSelector")
            .is_ok_and(|selector| selector.matches(labels))
}

fn policy_backend(observed: &Observed, names: &Names, templates: &Templates<'_>) -> Link {
    // Which templates the policy serves is told by the templates' conditions only.
    if let Some(why) = &templates.unread {
        return link(
            POLICY_BACKEND,
            State::Unknown,
            format!("{why}: which templates the policy backend serves is not known"),
        );
    }
    if let Some(why) = observed
        .guard
        .unread(&format!("validatingadmissionpolicy/{}", names.guard()))
    {
        return link(POLICY_BACKEND, State::Unknown, why);
    }
    let conditions = policy_conditions(templates);
    let served: Vec<&str> = conditions
        .iter()
        .filter(|(_, c)| c.status == "True")
        .map(|(name, _)| *name)
        .collect();
    let guarded = observed.guard.found().is_some();
    if served.is_empty() && observed.policy.is_missing() && !guarded {
        let message = if conditions.iter().any(|(_, c)| c.reason == "NotAvailable") {
            "not available: the API server serves no MutatingAdmissionPolicies (before Kubernetes 1.36); the webhook serves every template"
        } else {
            "not in use: the webhook serves every template"
        };
        return link(POLICY_BACKEND, State::Skipped, message);
    }
    if let Some(absent) = policy_objects_absent(observed, names, &served) {
        return absent;
    }
    policy_serving(names, guarded, &conditions, &served)
}

/// Each template's `PolicyServed` condition, when it has one.
fn policy_conditions<'t>(templates: &'t Templates<'_>) -> Vec<(&'t str, &'t Condition)> {
    templates
        .listed
        .iter()
        .filter_map(|t| {
            let name = t.metadata.name.as_deref()?;
            Some((name, templates.condition(name, POLICY_SERVED)?))
        })
        .collect()
}

/// The policy's line when it or its binding cannot be read, or is not there: broken while
/// templates say the policy serves them (the API server injects them nowhere), a warning
/// while none does (nothing is lost now, but the backend is half applied).
fn policy_objects_absent(observed: &Observed, names: &Names, served: &[&str]) -> Option<Link> {
    let objects = [
        (
            &observed.policy,
            format!("mutatingadmissionpolicy/{}", names.policy),
        ),
        (
            &observed.policy_binding,
            format!("mutatingadmissionpolicybinding/{}", names.policy),
        ),
    ];
    if let Some(why) = objects.iter().find_map(|(read, name)| read.unread(name)) {
        return Some(link(POLICY_BACKEND, State::Unknown, why));
    }
    let absent: Vec<&str> = objects
        .iter()
        .filter(|(read, _)| read.is_missing())
        .map(|(_, name)| name.as_str())
        .collect();
    if absent.is_empty() {
        return None;
    }
    let absent = absent.join(" and ");
    Some(if served.is_empty() {
        link(
            POLICY_BACKEND,
            State::Warning,
            format!(
                "{absent} not found, while no template says PolicyServed=True: nothing is lost now (a warning, not broken), but the backend is half applied; the leader applies both within a minute, else see the leader link"
            ),
        )
    } else {
        link(
            POLICY_BACKEND,
            State::Broken,
            format!(
                "{absent} not found, while {} say PolicyServed=True: the API server does not inject them; the leader applies it again within a minute, else see the leader link",
                served.join(", ")
            ),
        )
    })
}

/// The policy's line when it and its binding are there: what they serve, and the templates
/// whose proof failed (a warning: the webhook serves them, or nobody with the policy alone).
fn policy_serving(
    names: &Names,
    guarded: bool,
    conditions: &[(&str, &Condition)],
    served: &[&str],
) -> Link {
    let failed: Vec<String> = conditions
        .iter()
        .filter(|(_, c)| c.status != "True" && c.reason == "ProofFailed")
        .map(|(name, c)| format!("{name} ({})", c.message))
        .collect();
    let guard = if guarded {
        format!(
            "; its guard {} refuses the Pods a required template selects and it did not inject (no webhook)",
            names.guard()
        )
    } else {
        String::new()
    };
    let others: Vec<String> = conditions
        .iter()
        .filter(|(_, c)| c.status != "True" && c.reason != "ProofFailed")
        .map(|(name, c)| format!("{name} ({})", c.reason))
        .collect();
    let mut message = format!(
        "mutatingadmissionpolicy/{} and its binding serve {}{guard}",
        names.policy,
        if served.is_empty() {
            "no template".to_owned()
        } else {
            served.join(", ")
        }
    );
    if !others.is_empty() {
        message.push_str(&format!("; not served by it: {}", others.join(", ")));
    }
    if failed.is_empty() {
        return link(POLICY_BACKEND, State::Ok, message);
    }
    let by = if guarded {
        "nobody injects them"
    } else {
        "the webhook serves them"
    };
    link(
        POLICY_BACKEND,
        State::Warning,
        format!("{message}; proof failed for {}: {by}", failed.join(", ")),
    )
}

fn templates_ready(read: &Read<Vec<SidecarTemplate>>, templates: &Templates<'_>) -> Link {
    if let Some(why) = read.unread("sidecartemplates") {
        return link(TEMPLATES, State::Unknown, why);
    }
    let not_ready: Vec<String> = templates
        .listed
        .iter()
        .filter_map(|t| t.metadata.name.as_deref())
        .filter(|name| !templates.ready(name))
        .map(|name| {
            let reason = templates
                .condition(name, READY)
                .map_or("no status yet", |c| c.reason.as_str());
            format!("{name} ({reason})")
        })
        .collect();
    let count = templates.listed.len();
    if count == 0 {
        return link(
            TEMPLATES,
            State::Ok,
            "no SidecarTemplate: nothing is injected",
        );
    }
    if not_ready.is_empty() {
        return link(
            TEMPLATES,
            State::Ok,
            format!(
                "{}, every one Ready",
                counted(count, "template", "templates")
            ),
        );
    }
    link(
        TEMPLATES,
        State::Broken,
        format!(
            "{} of {count} not Ready: {}; `kubectl describe sct NAME` says why (no status yet: is there a leader?)",
            not_ready.len(),
            not_ready.join(", ")
        ),
    )
}

/// The namespace's labels for selection, `None` in the operator's own namespace (which no
/// template selects), or why they are not known.
fn selectable<'l>(
    name: &str,
    labels: &'l Read<BTreeMap<String, String>>,
    names: &Names,
) -> Result<Option<&'l BTreeMap<String, String>>, String> {
    if name == names.namespace {
        return Ok(None);
    }
    if let Some(why) = labels.unread(&format!("namespace/{name}")) {
        return Err(why);
    }
    labels
        .found()
        .map(Some)
        .ok_or_else(|| format!("namespace/{name} not found"))
}

fn describe(template: &CompiledTemplate) -> String {
    let required = match template.failure_policy {
        injector_api::FailurePolicy::Fail => "required",
        injector_api::FailurePolicy::Ignore => "best effort",
    };
    let on_request = match template.injection {
        injector_api::Injection::OnRequest => ", on request",
        injector_api::Injection::Automatic => "",
    };
    format!("{} ({required}{on_request})", template.name)
}

fn namespace(
    name: &str,
    labels: &Read<BTreeMap<String, String>>,
    names: &Names,
    templates: &Templates<'_>,
) -> Link {
    if let Some(why) = &templates.unread {
        return link(NAMESPACE, State::Unknown, why.clone());
    }
    let labels = match selectable(name, labels, names) {
        Err(why) => return link(NAMESPACE, State::Unknown, why),
        Ok(None) => {
            return link(
                NAMESPACE,
                State::Ok,
                format!("{name} is the operator's own: the webhook is never called for its Pods"),
            );
        }
        Ok(Some(labels)) => labels,
    };
    let info = NamespaceInfo {
        name,
        labels: Some(labels),
    };
    if let Some(skip) = pod_wide_skip(name, &info) {
        return link(
            NAMESPACE,
            State::Ok,
            format!("{name}: no template applies: {skip}"),
        );
    }
    let selecting: Vec<String> = templates
        .in_force
        .templates()
        .iter()
        .filter(|t| t.namespace_selector.matches(labels))
        .map(|t| describe(t))
        .collect();
    if selecting.is_empty() {
        return link(
            NAMESPACE,
            State::Ok,
            format!("{name}: no template in force selects it by its labels"),
        );
    }
    link(
        NAMESPACE,
        State::Ok,
        format!(
            "{name}: selected by {} (each then by its pod selector)",
            selecting.join(", ")
        ),
    )
}

/// Where a Pod stands with one template, as the operator judges it.
struct Standing<'t> {
    template: &'t CompiledTemplate,
    state: PodState,
}

fn standings<'t>(
    pod: &ObjectMeta,
    labels: Option<&BTreeMap<String, String>>,
    templates: &'t Templates<'_>,
) -> Vec<Standing<'t>> {
    let meta = PodMeta::of(pod);
    templates
        .in_force
        .templates()
        .iter()
        .filter_map(|template| {
            let state = standing(template, &meta, labels)?;
            Some(Standing { template, state })
        })
        .collect()
}

fn required(template: &CompiledTemplate) -> bool {
    template.failure_policy == injector_api::FailurePolicy::Fail
}

/// How a Pod missing `template` stands, and what to do. Not judged by when the Pod was
/// created: a selector widened or a namespace relabelled since selects Pods created long
/// after the template, and a best-effort template is skipped on a conflict by design. A
/// required one must be on every Pod it selects, however it came to miss it.
fn missing_note(pod: &str, namespace: &str, template: &CompiledTemplate) -> (State, String) {
    let name = &template.name;
    if required(template) {
        (
            State::Broken,
            format!(
                "missing required {name}, which every Pod it selects must carry: created before the template selected it (a template, a selector or the namespace's labels changed since), or admitted without the webhook; created again, it gets it (`kubectl sidecar explain pod/{pod} -n {namespace}` says what it would get)"
            ),
        )
    } else {
        (
            State::Warning,
            format!(
                "missing best-effort {name}: skipped at admission (a conflict: the TemplateSkipped Event on the Pod's owner names it, `kubectl get events -n {namespace} --field-selector reason=TemplateSkipped`), or created before the template selected it"
            ),
        )
    }
}

fn pod_links(
    ns: &str,
    name: &str,
    labels: &Read<BTreeMap<String, String>>,
    pod: &Read<Box<ObjectMeta>>,
    names: &Names,
    templates: &Templates<'_>,
) -> Vec<Link> {
    let what = format!("pod/{name} -n {ns}");
    if let Some(why) = pod.unread(&what).or_else(|| templates.unread.clone()) {
        return vec![link(SELECTION, State::Unknown, why)];
    }
    let Some(pod) = pod.found() else {
        return vec![link(SELECTION, State::Broken, format!("{what} not found"))];
    };
    let labels = match selectable(ns, labels, names) {
        Ok(labels) => labels,
        Err(why) => return vec![link(SELECTION, State::Unknown, why)],
    };
    let meta = PodMeta::of(pod);
    vec![
        selection(&what, ns, &meta, labels, templates),
        record(name, ns, pod, &meta, labels, templates),
    ]
}

/// The templates in force that select the Pod, by the operator's rules, and whether it opts
/// out of best-effort ones.
fn selection(
    what: &str,
    ns: &str,
    meta: &PodMeta<'_>,
    labels: Option<&BTreeMap<String, String>>,
    templates: &Templates<'_>,
) -> Link {
    let info = NamespaceInfo { name: ns, labels };
    let selecting: Vec<String> = match labels {
        None => Vec::new(),
        Some(_) => templates
            .in_force
            .templates()
            .iter()
            .filter(|t| selects(t, meta, &info))
            .map(|t| describe(t))
            .collect(),
    };
    let mut selection = if selecting.is_empty() {
        format!("{what}: no template in force selects it")
    } else {
        format!("{what}: selected by {}", selecting.join(", "))
    };
    if opts_out(meta.annotations.label(INJECT_ANNOTATION)) {
        selection.push_str(&format!(
            "; it opts out ({INJECT_ANNOTATION}: \"false\") of best-effort templates"
        ));
    }
    link(SELECTION, State::Ok, selection)
}

/// The Pod's record against what the templates in force inject: current, stale, missing
/// ([`missing_note`]), or carrying a template no longer in force.
fn record(
    name: &str,
    ns: &str,
    pod: &ObjectMeta,
    meta: &PodMeta<'_>,
    labels: Option<&BTreeMap<String, String>>,
    templates: &Templates<'_>,
) -> Link {
    let mut current = Vec::new();
    let mut problems = Vec::new();
    let mut state = State::Ok;
    for s in &standings(pod, labels, templates) {
        match s.state {
            PodState::Current => current.push(s.template.name.as_str()),
            PodState::Stale { .. } => {
                state = state.max(State::Warning);
                problems.push(format!(
                    "stale {} (carries an earlier version: created again, it gets generation {})",
                    s.template.name, s.template.generation
                ));
            }
            PodState::Missing => {
                let (judged, note) = missing_note(name, ns, s.template);
                state = state.max(judged);
                problems.push(note);
            }
        }
    }
    let in_force = templates.in_force.templates();
    for entry in recorded(meta.annotations) {
        if !in_force.iter().any(|t| t.name == entry.name) {
            state = state.max(State::Warning);
            problems.push(format!(
                "carries {}, which is no longer in force",
                entry.name
            ));
        }
    }
    let carried = meta
        .annotations
        .label(INJECTED_ANNOTATION)
        .unwrap_or("nothing");
    let mut message = format!("{INJECTED_ANNOTATION}: {carried}");
    if !current.is_empty() {
        message.push_str(&format!("; current with {}", current.join(", ")));
    }
    if !problems.is_empty() {
        message.push_str(&format!("; {}", problems.join("; ")));
    }
    link(RECORD, state, message)
}

fn namespace_pods(
    ns: &str,
    labels: &Read<BTreeMap<String, String>>,
    pods: &Read<Vec<ObjectMeta>>,
    names: &Names,
    templates: &Templates<'_>,
) -> Link {
    if let Some(why) = pods
        .unread(&format!("pods -n {ns}"))
        .or_else(|| templates.unread.clone())
    {
        return link(PODS, State::Unknown, why);
    }
    let labels = match selectable(ns, labels, names) {
        Ok(labels) => labels,
        Err(why) => return link(PODS, State::Unknown, why),
    };
    let pods: Vec<&ObjectMeta> = pods
        .found()
        .into_iter()
        .flatten()
        .filter(|p| injector_core::after_admission::lifecycle::counts(p))
        .collect();
    let (mut current, mut stale) = (0, 0);
    let (mut missing_required, mut missing_best_effort) = (Vec::new(), Vec::new());
    for pod in &pods {
        let name = pod.name.as_deref().unwrap_or_default();
        for s in standings(pod, labels, templates) {
            match s.state {
                PodState::Current => current += 1,
                PodState::Stale { .. } => stale += 1,
                PodState::Missing if required(s.template) => {
                    missing_required.push(format!("{name} ({})", s.template.name));
                }
                PodState::Missing => {
                    missing_best_effort.push(format!("{name} ({})", s.template.name));
                }
            }
        }
    }
    let message = format!(
        "{}: {current} current, {stale} stale, {} missing a template ({} required)",
        counted(pods.len(), "Pod", "Pods"),
        missing_required.len() + missing_best_effort.len(),
        missing_required.len(),
    );
    if !missing_required.is_empty() {
        return link(
            PODS,
            State::Broken,
            format!(
                "{message}; missing a required template, which every Pod it selects must carry: {}; created again, they get it (`kubectl sidecar check POD -n {ns}` says more)",
                first_few(&missing_required)
            ),
        );
    }
    if !missing_best_effort.is_empty() {
        return link(
            PODS,
            State::Warning,
            format!(
                "{message}; missing a best-effort template: {}: skipped at admission (a conflict: `kubectl get events -n {ns} --field-selector reason=TemplateSkipped`), or created before the template selected them",
                first_few(&missing_best_effort)
            ),
        );
    }
    if stale > 0 {
        return link(
            PODS,
            State::Warning,
            format!(
                "{message}; created again, they get what the templates inject now (`kubectl sidecar status` lists their workloads)"
            ),
        );
    }
    link(PODS, State::Ok, message)
}

/// How many names a message lists before it only counts the rest: a namespace may hold
/// thousands of Pods, and a line is read by a person.
const LISTED: usize = 5;

/// The first [`LISTED`] of `names`, and how many more there are.
fn first_few(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(LISTED).map(String::as_str).collect();
    let shown = shown.join(", ");
    match names.len().saturating_sub(LISTED) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

/// `n` and the noun, singular or plural.
fn counted(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The report as a table: one line per link.
pub fn to_table(report: &Report) -> String {
    let mut table = Table::new(["LINK", "STATE", "MESSAGE"]);
    for l in &report.links {
        table.row([l.link.to_owned(), l.state.to_string(), l.message.clone()]);
    }
    table.render()
}

/// The report as JSON: `{"links": [{"link", "state", "message"}], "broken"}`.
pub fn to_json(report: &Report) -> Result<String, serde_json::Error> {
    let mut json = serde_json::to_string_pretty(report)?;
    json.push('\n');
    Ok(json)
}

#[cfg(test)]
mod tests;
