//! The rollout scenarios (`updateStrategy: RollingRestart`) on the chart's operator, installed
//! with `rollouts.enabled=true`: running Pods become current through their workloads, never
//! more than the budget at once; pause and resume; a workload that cannot roll out halts the
//! rollout; Pods admitted without a best-effort template while no replica served are healed;
//! bare Pods and Jobs are left alone.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use injector_e2e::{Cluster, poll};
use serde_json::{Value, json};

use super::{CHART_OBJECTS, ensure_chart, scale_operator, wait_no_operator, wait_operator_ready};

/// The sidecar's first image and the one an edit brings (both stand-ins present on the node).
const FIRST_IMAGE: &str = "stand-in.invalid/busybox:1.36";
const SECOND_IMAGE: &str = "stand-in.invalid/httpd:2.4";

/// A best-effort template adding the container `agent` (running `sleep`) to every Pod of the
/// namespaces labelled `e2e.sidecar.dev/scenario: <scenario>`, rolled out by restarts.
fn rolling_template(name: &str, scenario: &str, image: &str, strategy: Value) -> Value {
    json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"e2e.sidecar.dev/scenario": scenario}},
            "failurePolicy": "Ignore",
            "updateStrategy": strategy,
            "containers": [{
                "name": "agent",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
            }],
        },
    })
}

/// A Deployment of `replicas` Pods running `sleep`; with `fails_after_restart`, a Pod made by
/// a restart (its template annotated `sidecar.dev/restartedAt`) never turns Ready, and the
/// Deployment keeps its old Pods (maxUnavailable 0): its rollout never completes.
fn deployment(namespace: &str, name: &str, replicas: u32, fails_after_restart: bool) -> Value {
    let script = if fails_after_restart {
        "if [ -z \"$RESTARTED\" ]; then touch /tmp/ready; fi; exec sleep 3600"
    } else {
        "touch /tmp/ready; exec sleep 3600"
    };
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "app",
                        "image": FIRST_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", script],
                        "env": [{
                            "name": "RESTARTED",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['sidecar.dev/restartedAt']"}},
                        }],
                        "readinessProbe": {
                            "exec": {"command": ["cat", "/tmp/ready"]},
                            "periodSeconds": 1,
                        },
                    }],
                },
            },
        },
    })
}

fn apply(cluster: &Cluster, object: &Value) -> anyhow::Result<()> {
    cluster.apply_yaml(&object.to_string()).map(drop)
}

/// Whether Deployment `d` (as JSON) is in the middle of a rollout.
fn rolling_out(d: &Value) -> bool {
    let wanted = d["spec"]["replicas"].as_i64().unwrap_or(1);
    let status = &d["status"];
    let count = |k: &str| status[k].as_i64().unwrap_or(0);
    status["observedGeneration"] != d["metadata"]["generation"]
        || count("updatedReplicas") < wanted
        || count("replicas") > wanted
        || count("availableReplicas") < wanted
}

/// Waits until every Deployment of `namespace` has rolled out.
fn wait_rolled_out(cluster: &Cluster, namespace: &str, timeout: Duration) -> anyhow::Result<()> {
    poll(
        timeout,
        &format!("the Deployments of {namespace} rolled out"),
        || {
            let deployments = cluster.list_json("deployments", Some(namespace), None)?;
            Ok(deployments.iter().all(|d| !rolling_out(d)).then_some(()))
        },
    )
}

fn wait_pod_counts(
    cluster: &Cluster,
    name: &str,
    want: [u64; 4],
    timeout: Duration,
) -> anyhow::Result<()> {
    injector_e2e::steps::wait_pod_counts(cluster, name, want, timeout).map(drop)
}

/// Template `name`'s `status.rollout.state`.
fn rollout_state(cluster: &Cluster, name: &str) -> anyhow::Result<Option<String>> {
    let template = cluster.get_json("sidecartemplate", None, name)?;
    Ok(template["status"]["rollout"]["state"]
        .as_str()
        .map(str::to_owned))
}

/// The uid and the `sidecar.dev/injected` record of every Pod of `namespace` matching
/// `selector`.
fn pod_records(
    cluster: &Cluster,
    namespace: &str,
    selector: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    Ok(cluster
        .list_json("pods", Some(namespace), Some(selector))?
        .iter()
        .map(|p| {
            (
                p["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
                p["metadata"]["annotations"]["sidecar.dev/injected"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect())
}

/// Runs `work` while a thread samples `count` every 250 ms; returns what `work` gave, the
/// most `count` ever said, and how many samples were taken.
fn watching<T: Send>(
    count: impl Fn() -> anyhow::Result<usize> + Sync,
    work: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, usize, usize)> {
    let most = AtomicUsize::new(0);
    let samples = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let watcher = scope.spawn(|| -> anyhow::Result<()> {
            while !done.load(Ordering::Relaxed) {
                most.fetch_max(count()?, Ordering::Relaxed);
                samples.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(250));
            }
            Ok(())
        });
        let result = work();
        done.store(true, Ordering::Relaxed);
        let watched = watcher
            .join()
            .map_err(|_| anyhow::anyhow!("the watcher panicked"))?;
        let value = result?;
        watched?;
        Ok((
            value,
            most.load(Ordering::Relaxed),
            samples.load(Ordering::Relaxed),
        ))
    })
}

/// m. `RollingRestart` with the default budget: an image edit makes 3 Deployments' Pods
/// stale; paused, nothing restarts; resumed, the Deployments restart one at a time (checked
/// every 250 ms) until every Pod they own is current; a bare Pod and a Job's Pod stay as they
/// were, reported as not restartable.
pub fn rolling_restart_within_the_budget(cluster: &Cluster) -> anyhow::Result<()> {
    ensure_chart(cluster)?;
    let name = "e2e-rolling";
    let ns = cluster.namespace("rolling", &[("e2e.sidecar.dev/scenario", "rolling")])?;
    let strategy = |paused: bool| json!({"type": "RollingRestart", "paused": paused});
    apply(
        cluster,
        &rolling_template(name, "rolling", FIRST_IMAGE, strategy(false)),
    )?;
    injector_e2e::steps::wait_served(cluster, name, CHART_OBJECTS)?;
    for workload in ["web-a", "web-b", "web-c"] {
        apply(cluster, &deployment(&ns, workload, 2, false))?;
    }
    apply(
        cluster,
        &json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "bare", "namespace": ns, "labels": {"kind": "bare"}},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "app", "image": FIRST_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]},
        }),
    )?;
    apply(
        cluster,
        &json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "batch", "namespace": ns},
            "spec": {"template": {"metadata": {"labels": {"kind": "job"}}, "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [{"name": "app", "image": FIRST_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}}},
        }),
    )?;
    wait_rolled_out(cluster, &ns, Duration::from_secs(120))?;
    wait_pod_counts(cluster, name, [8, 8, 0, 0], Duration::from_secs(30))?;
    let untouched_before = [
        pod_records(cluster, &ns, "kind=bare")?,
        pod_records(cluster, &ns, "kind=job")?,
    ];

    // Paused: the edit makes every Pod stale and nothing restarts.
    apply(
        cluster,
        &rolling_template(name, "rolling", SECOND_IMAGE, strategy(true)),
    )?;
    wait_pod_counts(cluster, name, [8, 0, 8, 0], Duration::from_secs(30))?;
    poll(Duration::from_secs(30), "the rollout Paused", || {
        Ok((rollout_state(cluster, name)?.as_deref() == Some("Paused")).then_some(()))
    })?;
    std::thread::sleep(Duration::from_secs(4));
    let deployments = cluster.list_json("deployments", Some(&ns), None)?;
    ensure!(
        deployments.iter().all(|d| {
            d["spec"]["template"]["metadata"]["annotations"]["sidecar.dev/restartedAt"].is_null()
        }),
        "a Deployment was restarted while paused"
    );

    // Resumed: one Deployment at a time, watched continuously.
    let started = Instant::now();
    let rolling_now = || -> anyhow::Result<usize> {
        let deployments = cluster.list_json("deployments", Some(&ns), None)?;
        Ok(deployments.iter().filter(|d| rolling_out(d)).count())
    };
    let ((), most, samples) = watching(rolling_now, || {
        apply(
            cluster,
            &rolling_template(name, "rolling", SECOND_IMAGE, strategy(false)),
        )?;
        wait_pod_counts(cluster, name, [8, 6, 2, 0], Duration::from_secs(240))?;
        poll(Duration::from_secs(60), "the rollout Complete", || {
            Ok((rollout_state(cluster, name)?.as_deref() == Some("Complete")).then_some(()))
        })?;
        wait_rolled_out(cluster, &ns, Duration::from_secs(60))
    })?;
    eprintln!(
        "[e2e] 3 Deployments restarted in {:.1?}; at most {most} rolling out at once ({samples} samples)",
        started.elapsed()
    );
    ensure!(
        most == 1,
        "{most} Deployments rolled out at once (budget 1)"
    );

    let template = cluster.get_json("sidecartemplate", None, name)?;
    ensure!(
        template["status"]["rollout"]["notRestartable"] == 2,
        "status.rollout: {}",
        template["status"]["rollout"]
    );
    let untouched_after = [
        pod_records(cluster, &ns, "kind=bare")?,
        pod_records(cluster, &ns, "kind=job")?,
    ];
    ensure!(
        untouched_before == untouched_after,
        "the bare Pod or the Job's Pod changed: {untouched_before:?} → {untouched_after:?}"
    );
    // Old Pods may still be terminating (their grace period is 1 s): only the live ones.
    let live = cluster.list_json("pods", Some(&ns), Some("app"))?;
    for pod in live
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
    {
        let image = pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == "agent")
            .map(|c| c["image"].clone());
        ensure!(
            image == Some(Value::from(SECOND_IMAGE)),
            "{}: agent image {image:?}",
            pod["metadata"]["name"]
        );
    }
    let restarts = cluster
        .list_json("events.events.k8s.io", Some("default"), None)?
        .into_iter()
        .filter(|e| e["regarding"]["name"] == name && e["reason"] == "Restarted")
        .count();
    ensure!(restarts == 3, "{restarts} Restarted events, expected 3");
    cluster.kubectl_ok(&["delete", "namespace", &ns, "--wait=false"])?;
    cluster.kubectl_ok(&["delete", "sidecartemplate", name])?;
    Ok(())
}

/// n. Pods a best-effort template missed while no replica served are reported missing and
/// healed by a restart of their Deployment; then an edit restarts a Deployment whose new Pods
/// never turn Ready, which halts the rollout with `RolloutBlocked=True`/`Halted` naming it.
pub fn a_stuck_rollout_halts_and_missing_pods_heal(cluster: &Cluster) -> anyhow::Result<()> {
    ensure_chart(cluster)?;
    let name = "e2e-healing";
    let ns = cluster.namespace("healing", &[("e2e.sidecar.dev/scenario", "healing")])?;
    // Healing gets a deadline a loaded machine meets (a new Pod Ready within 10 s was not
    // always: CI once saw the heal halted half-way); the stuck rollout below gets 10 s.
    let healing = json!({"type": "RollingRestart", "progressDeadlineSeconds": 60});
    let strategy = json!({"type": "RollingRestart", "progressDeadlineSeconds": 10});
    apply(
        cluster,
        &rolling_template(name, "healing", FIRST_IMAGE, healing),
    )?;
    injector_e2e::steps::wait_served(cluster, name, CHART_OBJECTS)?;
    apply(cluster, &deployment(&ns, "stuck", 1, true))?;
    wait_rolled_out(cluster, &ns, Duration::from_secs(90))?;

    // No replica serves: the best-effort template is skipped for the Pods created meanwhile.
    // Their records are read before a replica is back: a leader may heal them at once, and
    // the Deployment's new Pods carry the template (CI once saw them in the list).
    scale_operator(cluster, 0)?;
    let outcome = (|| -> anyhow::Result<Vec<(String, String)>> {
        wait_no_operator(cluster)?;
        apply(cluster, &deployment(&ns, "late", 2, false))?;
        wait_rolled_out(cluster, &ns, Duration::from_secs(90))?;
        pod_records(cluster, &ns, "app=late")
    })();
    scale_operator(cluster, 2)?;
    let late = outcome?;
    wait_operator_ready(cluster)?;
    ensure!(
        late.iter().all(|(_, record)| record.is_empty()),
        "Pods admitted while no replica served carry {late:?}"
    );

    // Reported missing, then healed by a restart of their Deployment.
    let started = Instant::now();
    wait_pod_counts(cluster, name, [3, 3, 0, 0], Duration::from_secs(120))?;
    wait_rolled_out(cluster, &ns, Duration::from_secs(60))?;
    eprintln!(
        "[e2e] the missing Pods healed {:.1?} after the operator came back",
        started.elapsed()
    );

    // An edit: `late` restarts and completes, `stuck` restarts and never does.
    apply(
        cluster,
        &rolling_template(name, "healing", SECOND_IMAGE, strategy),
    )?;
    let condition = injector_e2e::steps::wait_condition(
        cluster,
        name,
        ("RolloutBlocked", "True", "Halted"),
        Duration::from_secs(120),
    )?;
    let message = condition["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains(&format!("deployment/stuck -n {ns}")),
        "RolloutBlocked: {message}"
    );
    ensure!(rollout_state(cluster, name)?.as_deref() == Some("Halted"));
    let late = pod_records(cluster, &ns, "app=late")?;
    ensure!(
        late.len() == 2 && late.iter().all(|(_, r)| !r.is_empty()),
        "late: {late:?}"
    );
    eprintln!("[e2e] halted: {message}");
    cluster.kubectl_ok(&["delete", "namespace", &ns, "--wait=false"])?;
    cluster.kubectl_ok(&["delete", "sidecartemplate", name])?;
    Ok(())
}

/// The statuses of `pod`'s containers and init containers by name: (image, restartCount,
/// running).
fn container_statuses(pod: &Value) -> std::collections::BTreeMap<String, (String, i64, bool)> {
    ["containerStatuses", "initContainerStatuses"]
        .iter()
        .flat_map(|k| pod["status"][k].as_array().cloned().unwrap_or_default())
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_owned(),
                (
                    s["image"].as_str().unwrap_or_default().to_owned(),
                    s["restartCount"].as_i64().unwrap_or_default(),
                    s["state"]["running"].is_object(),
                ),
            )
        })
        .collect()
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// o. `InPlace`, on a required template: an image edit of a container and of a native sidecar
/// is set on the 3 running Pods of a Deployment, one Pod not Ready at most (sampled every
/// 250 ms), the Pods kept (same uids) and only the changed containers restarted by the
/// kubelet. The after-admission policy lets the operator's in-place update through and still
/// refuses anyone else's image for the sidecar on the running Pod. Then an edit of more than
/// images falls back to a restart of the Deployment.
pub fn in_place_image_updates(cluster: &Cluster) -> anyhow::Result<()> {
    ensure_chart(cluster)?;
    let name = "e2e-in-place";
    let ns = cluster.namespace("in-place", &[("e2e.sidecar.dev/scenario", "in-place")])?;
    let template = |image: &str, seconds: &str| {
        json!({
            "apiVersion": "sidecar.dev/v1alpha1",
            "kind": "SidecarTemplate",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {"matchLabels": {"e2e.sidecar.dev/scenario": "in-place"}},
                "failurePolicy": "Fail",
                "updateStrategy": {"type": "InPlace", "maxUnavailable": 1},
                "containers": [{"name": "proxy", "image": image, "imagePullPolicy": "Never", "command": ["sleep"], "args": [seconds]}],
                "initContainers": [{"name": "agent", "image": image, "imagePullPolicy": "Never", "restartPolicy": "Always", "command": ["sleep", "3600"]}],
            },
        })
    };
    apply(cluster, &template(FIRST_IMAGE, "3600"))?;
    injector_e2e::steps::wait_served(cluster, name, CHART_OBJECTS)?;
    apply(cluster, &deployment(&ns, "web", 3, false))?;
    wait_rolled_out(cluster, &ns, Duration::from_secs(120))?;
    wait_pod_counts(cluster, name, [3, 3, 0, 0], Duration::from_secs(30))?;
    let before: std::collections::BTreeMap<String, Value> = cluster
        .list_json("pods", Some(&ns), Some("app=web"))?
        .into_iter()
        .map(|p| {
            (
                p["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
                p,
            )
        })
        .collect();

    let started = Instant::now();
    let not_ready_now = || -> anyhow::Result<usize> {
        let pods = cluster.list_json("pods", Some(&ns), Some("app=web"))?;
        Ok(pods.iter().filter(|p| !is_ready(p)).count())
    };
    let (after, most, samples) = watching(not_ready_now, || {
        apply(cluster, &template(SECOND_IMAGE, "3600"))?;
        poll(
            Duration::from_secs(120),
            "every Pod Ready with the new images",
            || {
                let pods = cluster.list_json("pods", Some(&ns), Some("app=web"))?;
                let done = pods.len() == 3
                    && pods.iter().all(|p| {
                        let statuses = container_statuses(p);
                        is_ready(p)
                            && ["proxy", "agent"].iter().all(|c| {
                                statuses.get(*c).is_some_and(|(image, _, running)| {
                                    image.ends_with(SECOND_IMAGE) && *running
                                })
                            })
                    });
                Ok(done.then_some(pods))
            },
        )
    })?;
    wait_pod_counts(cluster, name, [3, 3, 0, 0], Duration::from_secs(30))?;
    eprintln!(
        "[e2e] 3 Pods updated in place in {:.1?}; at most {most} not Ready at once ({samples} samples)",
        started.elapsed()
    );
    ensure!(
        most <= 1,
        "{most} Pods not Ready at once (maxUnavailable 1)"
    );
    for pod in &after {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
        let earlier = before.get(uid).with_context(|| {
            format!(
                "Pod {} was replaced, not updated in place",
                pod["metadata"]["name"]
            )
        })?;
        let (then, now) = (container_statuses(earlier), container_statuses(pod));
        eprintln!(
            "[e2e] {}: before {then:?}, after {now:?}",
            pod["metadata"]["name"]
        );
        ensure!(
            then.get("app").map(|s| s.1) == now.get("app").map(|s| s.1),
            "the app container was restarted: {then:?} → {now:?}"
        );
        for changed in ["proxy", "agent"] {
            let (then, now) = (then.get(changed), now.get(changed));
            ensure!(
                now.map(|s| s.1) > then.map(|s| s.1),
                "{changed} was not restarted by the kubelet: {then:?} → {now:?}"
            );
        }
    }

    // Anyone else's image for the sidecar of a running Pod is refused.
    let running = after[0]["metadata"]["name"].as_str().unwrap_or_default();
    let refused = cluster.kubectl(&[
        "set",
        "image",
        "-n",
        &ns,
        &format!("pod/{running}"),
        &format!("proxy={FIRST_IMAGE}"),
    ])?;
    ensure!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("after-admission"),
        "the sidecar's image of a running Pod was set back: {}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // More than images (an argument): the Deployment is restarted instead.
    apply(cluster, &template(SECOND_IMAGE, "3601"))?;
    poll(Duration::from_secs(60), "the Deployment restarted", || {
        let web = cluster.get_json("deployment", Some(&ns), "web")?;
        let restarted =
            !web["spec"]["template"]["metadata"]["annotations"]["sidecar.dev/restartedAt"]
                .is_null();
        Ok(restarted.then_some(()))
    })?;
    wait_rolled_out(cluster, &ns, Duration::from_secs(120))?;
    wait_pod_counts(cluster, name, [3, 3, 0, 0], Duration::from_secs(30))?;
    // The old Pods may still be terminating for a moment.
    poll(
        Duration::from_secs(60),
        "3 new Pods, the old ones gone",
        || {
            let pods = cluster.list_json("pods", Some(&ns), Some("app=web"))?;
            let replaced = pods.len() == 3
                && pods.iter().all(|p| {
                    !before.contains_key(p["metadata"]["uid"].as_str().unwrap_or_default())
                });
            Ok(replaced.then_some(()))
        },
    )?;
    cluster.kubectl_ok(&["delete", "namespace", &ns, "--wait=false"])?;
    cluster.kubectl_ok(&["delete", "sidecartemplate", name])?;
    Ok(())
}
