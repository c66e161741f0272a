//! The template watch loop ([`watch_templates`]) driven by a scripted watch: a run of failures
//! makes the replica not ready past the grace period, the loop starts the watch again, and the
//! fresh list makes it ready. Tokio's clock is paused, so the grace period passes without
//! waiting for it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use injector_api::SidecarTemplate;
use injector_controller::operator::watch_templates;
use injector_controller::sync::{ObservedTemplates, TemplateSync};
use injector_core::Templates;
use kube::runtime::watcher::{self, Event};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

type Item = Result<Event<SidecarTemplate>, watcher::Error>;

fn template(name: &str) -> SidecarTemplate {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "sidecar.dev/v1alpha1",
        "kind": "SidecarTemplate",
        "metadata": {"name": name, "generation": 1},
        "spec": {"containers": [{"name": name, "image": "x"}]},
    }))
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_failing_watch_is_restarted_and_its_fresh_list_ends_the_failures() {
    const GRACE: Duration = Duration::from_secs(60);
    let templates = Templates::with_watch_grace(GRACE);
    let sync = TemplateSync::new(Arc::clone(&templates), ObservedTemplates::default());
    let (first_tx, first_rx) = mpsc::unbounded::<Item>();
    let (second_tx, second_rx) = mpsc::unbounded::<Item>();
    let watches = Arc::new(Mutex::new(vec![second_rx, first_rx]));
    let (started_tx, mut started) = mpsc::unbounded::<()>();
    let start_watch = {
        let watches = Arc::clone(&watches);
        move || {
            started_tx.unbounded_send(()).unwrap();
            watches
                .lock()
                .unwrap()
                .pop()
                .expect("no more watches scripted")
        }
    };
    let (reported_tx, mut reported) = mpsc::unbounded::<bool>();
    let stop = CancellationToken::new();
    let task = {
        let templates = Arc::clone(&templates);
        let stop = stop.clone();
        tokio::spawn(async move {
            watch_templates(start_watch, sync, &templates, stop, |_, outcome| {
                reported_tx.unbounded_send(outcome.is_ok()).unwrap();
            })
            .await;
        })
    };
    use futures::StreamExt as _;
    let far =
        |templates: &Templates| templates.freshness((Instant::now() + GRACE * 100).into_std());

    started.next().await.unwrap();
    first_tx.unbounded_send(Ok(Event::Init)).unwrap();
    first_tx
        .unbounded_send(Ok(Event::InitApply(template("a"))))
        .unwrap();
    first_tx.unbounded_send(Ok(Event::InitDone)).unwrap();
    for _ in 0..3 {
        assert!(reported.next().await.unwrap());
    }
    assert!(templates.is_synced());
    assert_eq!(far(&templates), Ok(()), "a healthy watch never goes stale");

    // The watch fails (and then, say, resumes silently: nothing more comes on it).
    first_tx
        .unbounded_send(Err(watcher::Error::NoResourceVersion))
        .unwrap();
    assert!(!reported.next().await.unwrap());
    assert!(
        far(&templates).is_err(),
        "failing: stale after the grace period"
    );
    assert_eq!(
        templates.freshness(Instant::now().into_std()),
        Ok(()),
        "not yet"
    );

    // Half a grace period later the loop starts the watch again (the paused clock jumps to
    // it), and the new watch's complete list ends the failures.
    started.next().await.unwrap();
    second_tx.unbounded_send(Ok(Event::Init)).unwrap();
    second_tx
        .unbounded_send(Ok(Event::InitApply(template("b"))))
        .unwrap();
    second_tx.unbounded_send(Ok(Event::InitDone)).unwrap();
    for _ in 0..3 {
        assert!(reported.next().await.unwrap());
    }
    assert_eq!(far(&templates), Ok(()));
    let names: Vec<String> = templates
        .snapshot()
        .templates()
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(names, ["b"], "the fresh list replaced the registry");

    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_watch_still_failing_after_the_restart_stays_not_ready() {
    const GRACE: Duration = Duration::from_secs(60);
    let templates = Templates::with_watch_grace(GRACE);
    templates.mark_synced();
    let sync = TemplateSync::new(Arc::clone(&templates), ObservedTemplates::default());
    let (first_tx, first_rx) = mpsc::unbounded::<Item>();
    let (second_tx, second_rx) = mpsc::unbounded::<Item>();
    let watches = Arc::new(Mutex::new(vec![second_rx, first_rx]));
    let (started_tx, mut started) = mpsc::unbounded::<()>();
    let start_watch = {
        let watches = Arc::clone(&watches);
        move || {
            started_tx.unbounded_send(()).unwrap();
            watches
                .lock()
                .unwrap()
                .pop()
                .expect("no more watches scripted")
        }
    };
    let stop = CancellationToken::new();
    let task = {
        let templates = Arc::clone(&templates);
        let stop = stop.clone();
        tokio::spawn(async move {
            watch_templates(start_watch, sync, &templates, stop, |_, _| {}).await;
        })
    };
    use futures::StreamExt as _;
    started.next().await.unwrap();
    let began = Instant::now();
    first_tx
        .unbounded_send(Err(watcher::Error::NoResourceVersion))
        .unwrap();
    started.next().await.unwrap();
    // The restarted watch fails too: the run goes on from its first failure.
    second_tx
        .unbounded_send(Err(watcher::Error::NoResourceVersion))
        .unwrap();
    tokio::time::sleep(GRACE).await;
    assert!(templates.freshness((began + GRACE * 2).into_std()).is_err());
    assert!(Instant::now() > began + GRACE);
    assert!(
        templates.freshness(Instant::now().into_std()).is_err(),
        "not ready"
    );
    stop.cancel();
    task.await.unwrap();
}
