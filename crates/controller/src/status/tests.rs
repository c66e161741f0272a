#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use injector_core::compile;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::client::Body;
use kube::runtime::events::Reporter;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

use super::*;

type ApiServer = Handle<Request<Body>, Response<Body>>;

/// A SidecarTemplate from YAML (apiVersion and kind are filled in).
fn parse_template(yaml: &str) -> SidecarTemplate {
    let mut value: Value = serde_saphyr::from_str(yaml).unwrap();
    value["apiVersion"] = "sidecar.dev/v1alpha1".into();
    value["kind"] = "SidecarTemplate".into();
    serde_json::from_value(value).unwrap()
}

/// A valid template at generation 3.
fn valid() -> SidecarTemplate {
    parse_template(
        "metadata: {name: log-shipper, generation: 3, uid: 7f2c, resourceVersion: '41'}\n\
         spec:\n  namespaceSelector: {matchLabels: {logs: 'on'}}\n  containers: [{name: shipper, image: fluent-bit:3}]",
    )
}

/// The same template made invalid at generation 4, with two problems.
fn invalid() -> SidecarTemplate {
    parse_template(
        "metadata: {name: log-shipper, generation: 4, uid: 7f2c, resourceVersion: '42'}\n\
         spec:\n  namespaceSelector: {matchLabels: {logs: 'on'}}\n  containers: [{name: shipper, restartPolicy: Always}]",
    )
}

/// What the caller passes: the serving group's id, or every validation error.
fn outcome(template: &SidecarTemplate) -> Result<GroupId, ValidationErrors> {
    compile(template).map(|compiled| compiled.group.id())
}

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(second).unwrap())
}

fn ready(status: &SidecarTemplateStatus) -> &Condition {
    assert_eq!(status.conditions.len(), 1, "{status:?}");
    ready_condition(status).expect("a Ready condition")
}

/// `template` carrying `status`, as the next reconcile reads it back.
fn with_status(mut template: SidecarTemplate, status: SidecarTemplateStatus) -> SidecarTemplate {
    template.status = Some(status);
    template
}

#[test]
fn valid_template_is_ready_and_names_its_webhook_entry() {
    let template = valid();
    let id = outcome(&template).unwrap();
    let entry = entry_name(&id);
    let status = desired_status(&template, &Ok::<_, ValidationErrors>(id.clone()), at(100));
    let condition = ready(&status);
    assert_eq!(condition.type_, "Ready");
    assert_eq!(condition.status, "True");
    assert_eq!(condition.reason, "Valid");
    assert_eq!(
        condition.message,
        format!("in use; served by webhook entry {entry}")
    );
    assert!(entry.starts_with("fail-") && entry.ends_with(".webhook.sidecar.dev"));
    assert_eq!(condition.last_transition_time, at(100));
}

#[test]
fn a_valid_template_without_an_entry_is_not_ready_and_says_why() {
    let template = valid();
    let id = outcome(&template).unwrap();
    let served = desired_status(&template, &Ok::<_, ValidationErrors>(id), at(100));
    let status =
        desired_status_not_served(&with_status(template, served.clone()), "too big", at(200));
    let condition = ready(&status);
    assert_eq!(condition.status, "False");
    assert_eq!(condition.reason, "NotServed");
    assert_eq!(condition.message, "valid, but not in use: too big");
    assert_eq!(condition.last_transition_time, at(200), "a transition");
    assert_eq!(
        status.last_valid, served.last_valid,
        "still its last valid generation"
    );
    assert!(needs_update(Some(&served), &status));
}

#[test]
fn invalid_template_is_not_ready_with_every_message() {
    let template = invalid();
    let outcome = outcome(&template);
    let errors = outcome.as_ref().unwrap_err();
    assert_eq!(errors.errors.len(), 2, "{errors}");
    let status = desired_status(&template, &outcome, at(100));
    let condition = ready(&status);
    assert_eq!(condition.status, "False");
    assert_eq!(condition.reason, "Invalid");
    assert_eq!(
        condition.message,
        "spec.containers[0].image: is required; spec.containers[0].restartPolicy: is only \
         allowed on initContainers (use it there for a native sidecar)"
    );
}

#[test]
fn observed_generation_is_on_the_status_and_the_condition() {
    for template in [valid(), invalid()] {
        let status = desired_status(&template, &outcome(&template), at(100));
        assert_eq!(status.observed_generation, template.metadata.generation);
        assert_eq!(
            ready(&status).observed_generation,
            template.metadata.generation
        );
    }
    let mut template = valid();
    template.metadata.generation = None;
    let status = desired_status(&template, &outcome(&template), at(100));
    assert_eq!(status.observed_generation, None);
    assert_eq!(ready(&status).observed_generation, None);
}

/// `invalid()` with generation 3 of `valid()` still in force.
fn kept_status(now: Time) -> (SidecarTemplate, SidecarTemplateStatus) {
    let template = invalid();
    let kept = Kept {
        generation: 3,
        group: outcome(&valid()).unwrap(),
    };
    let status = desired_status_kept(&template, &outcome(&template), Some(&kept), now);
    (template, status)
}

#[test]
fn a_required_templates_last_valid_generation_is_recorded_and_kept_while_invalid() {
    let template = valid();
    let status = desired_status(&template, &outcome(&template), at(100));
    let recorded = status.last_valid.clone().unwrap();
    assert_eq!(recorded.generation, 3);
    assert_eq!(recorded.spec, serde_json::to_value(&template.spec).unwrap());
    assert!(needs_update(
        Some(&SidecarTemplateStatus {
            last_valid: None,
            ..status.clone()
        }),
        &status
    ));

    // Made invalid: what the status records stays, so that a replica started now keeps it.
    let invalid = with_status(invalid(), status);
    let kept = Kept {
        generation: 3,
        group: outcome(&template).unwrap(),
    };
    let status = desired_status_kept(&invalid, &outcome(&invalid), Some(&kept), at(200));
    assert_eq!(status.last_valid, Some(recorded));

    // A best-effort template records nothing.
    let mut best_effort = valid();
    best_effort.spec.failure_policy = injector_api::FailurePolicy::Ignore;
    let status = desired_status(&best_effort, &outcome(&best_effort), at(100));
    assert_eq!(status.last_valid, None);
}

#[test]
fn a_kept_generation_is_degraded_with_every_message_and_the_generation_in_force() {
    let (template, status) = kept_status(at(100));
    assert_eq!(status.conditions.len(), 2, "{status:?}");
    let ready = ready_condition(&status).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Invalid"),
        "Ready keeps its meaning: this generation is invalid"
    );
    let degraded = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .unwrap();
    assert_eq!(degraded.status, "True");
    assert_eq!(degraded.reason, "InvalidGenerationKept");
    assert_eq!(degraded.observed_generation, Some(4));
    assert_eq!(degraded.last_transition_time, at(100));
    let entry = entry_name(&outcome(&valid()).unwrap());
    assert_eq!(
        degraded.message,
        format!(
            "generation 4 is invalid; the last valid generation, 3, stays in force (webhook \
             entry {entry}) until the template is fixed or deleted: \
             spec.containers[0].image: is required; spec.containers[0].restartPolicy: is \
             only allowed on initContainers (use it there for a native sidecar)"
        )
    );
    // Written once, then a resync writes nothing and keeps the time.
    let written = with_status(template, status.clone());
    assert!(!needs_update(written.status.as_ref(), &status));
    let again = desired_status_kept(
        &written,
        &outcome(&written),
        Some(&Kept {
            generation: 3,
            group: outcome(&valid()).unwrap(),
        }),
        at(200),
    );
    assert_eq!(again, status);
    // Without a kept generation (a best-effort template), no Degraded condition.
    let plain = desired_status(&invalid(), &outcome(&invalid()), at(100));
    assert_eq!(plain.conditions.len(), 1);
}

#[test]
fn a_degraded_condition_no_longer_wanted_is_removed() {
    let (template, degraded) = kept_status(at(100));
    // Fixed: the Ready condition flips and Degraded must go.
    let mut fixed = with_status(valid(), degraded.clone());
    fixed.metadata.generation = Some(4);
    let desired = desired_status(&fixed, &outcome(&fixed), at(200));
    assert!(desired.conditions.iter().all(|c| c.type_ != "Degraded"));
    assert!(needs_update(fixed.status.as_ref(), &desired));
    // Same generation, same Ready, but Degraded there and unwanted (a new leader that
    // never saw the valid generation): still written, so the status does not claim a
    // generation is in force when it is not.
    let template = with_status(template, degraded);
    let desired = desired_status(&template, &outcome(&template), at(200));
    assert!(needs_update(template.status.as_ref(), &desired));
    // A condition of another writer is left alone.
    let mut other = desired.clone();
    other.conditions.push(Condition {
        type_: "Audited".into(),
        status: "True".into(),
        reason: "Ok".into(),
        message: String::new(),
        last_transition_time: at(1),
        observed_generation: None,
    });
    assert!(!needs_update(Some(&other), &desired));
}

#[test]
fn last_transition_time_is_kept_while_the_status_stays_the_same() {
    let first = desired_status(&valid(), &outcome(&valid()), at(100));
    // A new generation, still valid: a new message is possible, the time is not.
    let mut template = with_status(valid(), first);
    template.metadata.generation = Some(5);
    let second = desired_status(&template, &outcome(&template), at(200));
    assert_eq!(ready(&second).last_transition_time, at(100));
    assert_eq!(ready(&second).observed_generation, Some(5));

    let broken = desired_status(&invalid(), &outcome(&invalid()), at(300));
    let template = with_status(invalid(), broken);
    let still_broken = desired_status(&template, &outcome(&template), at(400));
    assert_eq!(ready(&still_broken).last_transition_time, at(300));
}

#[test]
fn last_transition_time_changes_when_the_status_flips() {
    let good = desired_status(&valid(), &outcome(&valid()), at(100));
    let template = with_status(invalid(), good);
    let bad = desired_status(&template, &outcome(&template), at(200));
    assert_eq!(ready(&bad).status, "False");
    assert_eq!(ready(&bad).last_transition_time, at(200));

    let template = with_status(valid(), bad);
    let good_again = desired_status(&template, &outcome(&template), at(300));
    assert_eq!(ready(&good_again).status, "True");
    assert_eq!(ready(&good_again).last_transition_time, at(300));
}

#[test]
fn a_condition_of_another_type_does_not_lend_its_time() {
    let mut other = desired_status(&valid(), &outcome(&valid()), at(100));
    other.conditions[0].type_ = "Other".into();
    let template = with_status(valid(), other);
    let status = desired_status(&template, &outcome(&template), at(200));
    assert_eq!(ready(&status).last_transition_time, at(200));
}

#[test]
fn needs_update_when_there_is_no_status_or_no_ready_condition() {
    let desired = desired_status(&valid(), &outcome(&valid()), at(100));
    assert!(needs_update(None, &desired));
    assert!(needs_update(
        Some(&SidecarTemplateStatus::default()),
        &desired
    ));
    let mut other = desired.clone();
    other.conditions[0].type_ = "Other".into();
    assert!(needs_update(Some(&other), &desired));
}

#[test]
fn a_resync_of_an_unchanged_template_writes_nothing() {
    let written = desired_status(&valid(), &outcome(&valid()), at(100));
    let template = with_status(valid(), written.clone());
    let again = desired_status(&template, &outcome(&template), at(200));
    assert!(!needs_update(Some(&written), &again));
    // Even a desired status freshly stamped with another time.
    let fresh = desired_status(&valid(), &outcome(&valid()), at(300));
    assert!(!needs_update(Some(&written), &fresh));
}

#[test]
fn conditions_of_other_writers_do_not_count() {
    let desired = desired_status(&valid(), &outcome(&valid()), at(100));
    let mut existing = desired.clone();
    let mut other = existing.conditions[0].clone();
    other.type_ = "example.com/Audited".into();
    existing.conditions.insert(0, other);
    assert!(!needs_update(Some(&existing), &desired));
}

#[test]
fn needs_update_when_anything_but_the_time_differs() {
    let desired = desired_status(&valid(), &outcome(&valid()), at(100));
    let changes: [fn(&mut SidecarTemplateStatus); 5] = [
        |s| s.observed_generation = Some(2),
        |s| s.conditions[0].observed_generation = Some(2),
        |s| s.conditions[0].status = "False".into(),
        |s| s.conditions[0].reason = "Invalid".into(),
        |s| s.conditions[0].message = "in use; served by webhook entry x".into(),
    ];
    for change in changes {
        let mut existing = desired.clone();
        change(&mut existing);
        assert!(needs_update(Some(&existing), &desired), "{existing:?}");
    }
    let flipped = desired_status(&invalid(), &outcome(&invalid()), at(100));
    assert!(needs_update(Some(&desired), &flipped));
}

#[test]
fn truncate_cuts_on_a_char_boundary_and_marks_the_cut() {
    assert_eq!(truncate("short".into(), 1024), "short");
    let exact = "a".repeat(1024);
    assert_eq!(truncate(exact.clone(), 1024), exact);
    // 'é' is two bytes: cutting at 1021 bytes would split one.
    let long = "é".repeat(600);
    let cut = truncate(long, 1024);
    assert!(cut.len() <= 1024, "{}", cut.len());
    assert!(cut.ends_with('…'));
    assert_eq!(cut.trim_end_matches('…').chars().count(), 510);
}

#[test]
fn a_huge_invalid_message_is_cut_in_the_condition() {
    let errors = ValidationErrors {
        template: "t".into(),
        errors: (0..2000)
            .map(|i| injector_core::FieldError::new(format!("spec.x[{i}]"), "is bad"))
            .collect(),
    };
    let status = desired_status(&invalid(), &Err::<GroupId, _>(errors), at(100));
    let message = &ready(&status).message;
    assert!(message.len() <= CONDITION_MESSAGE_MAX_BYTES);
    assert!(message.starts_with("spec.x[0]: is bad; spec.x[1]: is bad"));
    assert!(message.ends_with('…'));
}

/// A client whose API server is `handle`.
fn mock_client() -> (Client, ApiServer) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), handle)
}

/// Waits for the next request, failing the test rather than hanging when none comes.
async fn next_request(
    server: &mut ApiServer,
) -> (Request<Body>, mock::SendResponse<Response<Body>>) {
    tokio::time::timeout(Duration::from_secs(5), server.next_request())
        .await
        .expect("a request within 5 s")
        .expect("the client is still there")
}

async fn json_body(request: Request<Body>) -> Value {
    let bytes = request.into_body().collect_bytes().await.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn respond(send: mock::SendResponse<Response<Body>>, status: StatusCode, body: &Value) {
    let response = Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap();
    send.send_response(response);
}

fn content_type(request: &Request<Body>) -> &str {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

#[tokio::test]
async fn write_status_applies_only_the_status_to_the_subresource() {
    let (client, mut server) = mock_client();
    let template = invalid();
    let status = desired_status(&template, &outcome(&template), at(1_700_000_000));
    let answer = with_status(template, status.clone());
    let api_server = tokio::spawn(async move {
        let (request, send) = next_request(&mut server).await;
        assert_eq!(request.method(), Method::PATCH);
        assert_eq!(
            request.uri().path(),
            "/apis/sidecar.dev/v1alpha1/sidecartemplates/log-shipper/status"
        );
        let query = request.uri().query().unwrap_or_default();
        assert!(query.contains("fieldManager=sidecar-injector"), "{query}");
        assert!(query.contains("force=true"), "{query}");
        assert_eq!(content_type(&request), "application/apply-patch+yaml");
        let body = json_body(request).await;
        assert_eq!(
            body,
            json!({
                "apiVersion": "sidecar.dev/v1alpha1",
                "kind": "SidecarTemplate",
                "status": {
                    "conditions": [{
                        "type": "Ready",
                        "status": "False",
                        "reason": "Invalid",
                        "message": "spec.containers[0].image: is required; \
                            spec.containers[0].restartPolicy: is only allowed on \
                            initContainers (use it there for a native sidecar)",
                        "lastTransitionTime": "2023-11-14T22:13:20Z",
                        "observedGeneration": 4,
                    }],
                    "observedGeneration": 4,
                },
            })
        );
        respond(
            send,
            StatusCode::OK,
            &serde_json::to_value(&answer).unwrap(),
        );
    });
    let api = Api::<SidecarTemplate>::all(client);
    let result = write_status(&api, "log-shipper", &status).await;
    api_server.await.unwrap();
    result.unwrap();
}

#[tokio::test]
async fn write_status_reports_a_rejection() {
    let (client, mut server) = mock_client();
    let api_server = tokio::spawn(async move {
        let (_, send) = next_request(&mut server).await;
        respond(
            send,
            StatusCode::FORBIDDEN,
            &json!({
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": "sidecartemplates.sidecar.dev \"log-shipper\" is forbidden",
                "reason": "Forbidden",
                "code": 403,
            }),
        );
    });
    let status = desired_status(&valid(), &outcome(&valid()), at(100));
    let api = Api::<SidecarTemplate>::all(client);
    let result = write_status(&api, "log-shipper", &status).await;
    api_server.await.unwrap();
    match result {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403),
        other => panic!("expected a 403, got {other:?}"),
    }
}

/// Answers an event create (or patch) by echoing the event, as the API server does.
async fn expect_event(server: &mut ApiServer, method: Method) -> Value {
    let (request, send) = next_request(server).await;
    assert_eq!(request.method(), method);
    let path = request.uri().path().to_owned();
    assert!(
        path.starts_with("/apis/events.k8s.io/v1/namespaces/default/events"),
        "{path}"
    );
    let expected_type = if method == Method::POST {
        "application/json"
    } else {
        "application/merge-patch+json"
    };
    assert_eq!(content_type(&request), expected_type);
    let body = json_body(request).await;
    let status = if method == Method::POST {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut echo = body.clone();
    echo["apiVersion"] = "events.k8s.io/v1".into();
    echo["kind"] = "Event".into();
    echo["metadata"]["namespace"] = "default".into();
    respond(send, status, &echo);
    body
}

fn recorder(client: Client) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: "sidecar-injector".into(),
            instance: Some("sidecar-injector-0".into()),
        },
    )
}

#[tokio::test]
async fn record_invalid_posts_a_warning_event_in_the_default_namespace() {
    let (client, mut server) = mock_client();
    let template = invalid();
    let errors = compile(&template).unwrap_err();
    let api_server = tokio::spawn(async move {
        let event = expect_event(&mut server, Method::POST).await;
        assert_eq!(event["type"], "Warning");
        assert_eq!(event["reason"], "Invalid");
        assert_eq!(event["action"], "Validate");
        assert_eq!(
            event["note"],
            "spec.containers[0].image: is required; spec.containers[0].restartPolicy: is \
             only allowed on initContainers (use it there for a native sidecar)"
        );
        assert_eq!(
            event["regarding"],
            json!({
                "apiVersion": "sidecar.dev/v1alpha1",
                "kind": "SidecarTemplate",
                "name": "log-shipper",
                "uid": "7f2c",
                "resourceVersion": "42",
            })
        );
        assert_eq!(event["reportingController"], "sidecar-injector");
        assert_eq!(event["reportingInstance"], "sidecar-injector-0");
    });
    let result = record_invalid(&recorder(client), &template, &errors).await;
    api_server.await.unwrap();
    result.unwrap();
}

#[tokio::test]
async fn record_kept_posts_a_warning_event_naming_the_generation_in_force() {
    let (client, mut server) = mock_client();
    let template = invalid();
    let errors = compile(&template).unwrap_err();
    let kept = Kept {
        generation: 3,
        group: outcome(&valid()).unwrap(),
    };
    let api_server = tokio::spawn(async move {
        let event = expect_event(&mut server, Method::POST).await;
        assert_eq!(event["type"], "Warning");
        assert_eq!(event["reason"], "InvalidGenerationKept");
        assert_eq!(event["action"], "Validate");
        let note = event["note"].as_str().unwrap();
        assert!(
            note.starts_with(
                "generation 4 is invalid; the last valid generation, 3, stays in force"
            ),
            "{note}"
        );
        assert!(
            note.contains("spec.containers[0].image: is required"),
            "{note}"
        );
        assert_eq!(event["regarding"]["name"], "log-shipper");
    });
    let result = record_kept(&recorder(client), &template, &errors, &kept).await;
    api_server.await.unwrap();
    result.unwrap();
}

#[tokio::test]
async fn record_invalid_cuts_a_long_note() {
    let (client, mut server) = mock_client();
    let template = invalid();
    let errors = ValidationErrors {
        template: "log-shipper".into(),
        errors: (0..100)
            .map(|i| injector_core::FieldError::new(format!("spec.volumes[{i}].name"), "é"))
            .collect(),
    };
    let api_server = tokio::spawn(async move {
        let event = expect_event(&mut server, Method::POST).await;
        let note = event["note"].as_str().unwrap();
        assert!(note.len() <= NOTE_MAX_BYTES, "{}", note.len());
        assert!(note.starts_with("spec.volumes[0].name: é; spec.volumes[1].name: é"));
        assert!(note.ends_with('…'));
    });
    let result = record_invalid(&recorder(client), &template, &errors).await;
    api_server.await.unwrap();
    result.unwrap();
}

#[tokio::test]
async fn a_repeat_is_folded_but_an_edited_template_gets_a_new_event() {
    let (client, mut server) = mock_client();
    let recorder = recorder(client);
    let template = invalid();
    let errors = compile(&template).unwrap_err();
    let mut edited = invalid();
    edited.metadata.resource_version = Some("57".into());
    edited.spec.containers[0].image = Some("fluent-bit:3".into());
    let edited_errors = compile(&edited).unwrap_err();

    let api_server = tokio::spawn(async move {
        let first = expect_event(&mut server, Method::POST).await;
        let repeat = expect_event(&mut server, Method::PATCH).await;
        assert_eq!(repeat["metadata"]["name"], first["metadata"]["name"]);
        assert_eq!(repeat["series"]["count"], 2);
        let after_edit = expect_event(&mut server, Method::POST).await;
        assert_ne!(after_edit["metadata"]["name"], first["metadata"]["name"]);
        assert_eq!(after_edit["regarding"]["resourceVersion"], "57");
        assert_eq!(
            after_edit["note"],
            "spec.containers[0].restartPolicy: is only allowed on initContainers (use it \
             there for a native sidecar)"
        );
    });
    let results = [
        record_invalid(&recorder, &template, &errors).await,
        record_invalid(&recorder, &template, &errors).await,
        record_invalid(&recorder, &edited, &edited_errors).await,
    ];
    api_server.await.unwrap();
    for result in results {
        result.unwrap();
    }
}

fn policy_condition(status: &SidecarTemplateStatus) -> Option<&Condition> {
    status.conditions.iter().find(|c| c.type_ == POLICY_SERVED)
}

/// A valid template, its status, and a policy backend state serving it.
fn served_by_policy() -> (SidecarTemplate, SidecarTemplateStatus, PolicyState) {
    let template = valid();
    let id = outcome(&template).unwrap();
    let base = desired_status(&template, &Ok::<_, ValidationErrors>(id), at(100));
    let state = PolicyState {
        policy: "sidecar-injector".into(),
        available: true,
        served: ["log-shipper".to_owned()].into(),
        ..PolicyState::default()
    };
    (template, base, state)
}

#[test]
fn the_policy_condition_says_which_backend_serves_the_template_and_why() {
    let (template, base, mut state) = served_by_policy();

    // The backend is off: no condition.
    let status = with_policy(&template, base.clone(), None, true, at(100));
    assert!(policy_condition(&status).is_none());

    let status = with_policy(&template, base.clone(), Some(&state), true, at(100));
    let served = policy_condition(&status).unwrap();
    assert_eq!(
        (served.status.as_str(), served.reason.as_str()),
        ("True", "Served")
    );
    assert!(
        served
            .message
            .contains("MutatingAdmissionPolicy sidecar-injector"),
        "{}",
        served.message
    );

    // A newer policy failing keeps the one in force, and says so.
    state.failure = Some("the dry-run Pod was refused: boom".into());
    let status = with_policy(&template, base.clone(), Some(&state), true, at(200));
    let kept = policy_condition(&status).unwrap();
    assert_eq!(kept.status, "True");
    assert!(kept.message.contains("boom"), "{}", kept.message);

    // Not in the policy in force because the proof failed.
    state.served.clear();
    let status = with_policy(&template, base.clone(), Some(&state), true, at(200));
    let failed = policy_condition(&status).unwrap();
    assert_eq!(
        (failed.status.as_str(), failed.reason.as_str()),
        ("False", "ProofFailed")
    );

    // Not expressible beats the failure: it is why the template is not in any policy.
    state.webhook_only.insert(
        "log-shipper".into(),
        (
            "NotExpressible",
            "appContainers.envFrom is compared by content".into(),
        ),
    );
    let status = with_policy(&template, base.clone(), Some(&state), true, at(200));
    let webhook = policy_condition(&status).unwrap();
    assert_eq!(
        (webhook.status.as_str(), webhook.reason.as_str()),
        ("False", "NotExpressible")
    );
    assert!(webhook.message.contains("envFrom"), "{}", webhook.message);

    // The API server serves no policies.
    let state = PolicyState {
        available: false,
        ..PolicyState::default()
    };
    let status = with_policy(&template, base.clone(), Some(&state), true, at(300));
    let unavailable = policy_condition(&status).unwrap();
    assert_eq!(unavailable.reason, "NotAvailable");

    // The transition time holds while the status does.
    let later = with_policy(
        &with_status(template.clone(), status.clone()),
        base,
        Some(&state),
        true,
        at(900),
    );
    assert_eq!(
        policy_condition(&later).unwrap().last_transition_time,
        at(300)
    );
}

#[test]
fn with_the_policy_backend_a_template_the_policy_does_not_serve_is_not_in_use() {
    let (template, base, mut state) = served_by_policy();
    // Served: `Ready` names the policy, not a webhook entry.
    assert_eq!(
        not_injected_by_policy(Some(&state), "log-shipper", true),
        None
    );
    let served = in_use_by_policy(
        with_policy(&template, base.clone(), Some(&state), false, at(100)),
        "sidecar-injector",
    );
    let ready = ready_condition(&served).unwrap();
    assert_eq!(ready.status, "True");
    assert!(
        ready
            .message
            .contains("MutatingAdmissionPolicy sidecar-injector")
    );
    assert!(
        policy_condition(&served)
            .unwrap()
            .message
            .contains("no webhook is called")
    );
    // Undecided: nothing to say yet.
    assert_eq!(not_injected_by_policy(None, "log-shipper", true), None);

    state.served.clear();
    state.webhook_only.insert(
        "log-shipper".into(),
        (
            "NotExpressible",
            "appContainers.envFrom is compared by content".into(),
        ),
    );
    let why = not_injected_by_policy(Some(&state), "log-shipper", true).unwrap();
    assert!(
        why.contains("envFrom") && why.contains("Pods it selects are refused"),
        "{why}"
    );
    let best_effort = not_injected_by_policy(Some(&state), "log-shipper", false).unwrap();
    assert!(!best_effort.contains("refused"));
    let status = with_policy(&template, base.clone(), Some(&state), false, at(100));
    assert!(
        policy_condition(&status)
            .unwrap()
            .message
            .starts_with("not injected: ")
    );

    state.webhook_only.clear();
    state.available = false;
    let why = not_injected_by_policy(Some(&state), "log-shipper", false).unwrap();
    assert!(
        why.contains("does not serve MutatingAdmissionPolicies"),
        "{why}"
    );
}

#[test]
fn a_required_template_the_guard_refuses_says_so_and_is_not_ready() {
    let (template, base, mut state) = served_by_policy();
    state.served.clear();
    // Before its proof ends, the guard refuses what it selects.
    state.refused.insert(
        "log-shipper".into(),
        "the injection backend is policy, and the policy that injects it is not proven yet".into(),
    );
    let why = not_injected_by_policy(Some(&state), "log-shipper", true).unwrap();
    assert!(
        why.contains("not proven yet") && why.contains("Pods it selects are refused"),
        "{why}"
    );
    let status = with_policy(
        &template,
        desired_status_not_served(&template, &why, at(100)),
        Some(&state),
        false,
        at(100),
    );
    let condition = policy_condition(&status).unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "NotProven")
    );
    assert_eq!(ready_condition(&status).unwrap().status, "False");

    // Its proof failed: the reason is the API server's, and the Pods stay refused.
    let refusal = "the dry-run Pod was refused: pods \"x\" is forbidden: violates PodSecurity \"restricted:latest\": privileged";
    state.failure = Some(format!("the generated policy failed its proof: {refusal}"));
    state.refused.insert(
        "log-shipper".into(),
        format!("the injection backend is policy, and its proof failed: {refusal}"),
    );
    let why = not_injected_by_policy(Some(&state), "log-shipper", true).unwrap();
    assert!(
        why.contains("violates PodSecurity") && why.contains("refused"),
        "{why}"
    );
    // Where the guard in force does not refuse them all (it keeps a version the policy in
    // force injects, or this leader does not know it yet), no more is claimed.
    let mut kept = state.clone();
    kept.refused.clear();
    let why = not_injected_by_policy(Some(&kept), "log-shipper", true).unwrap();
    assert!(
        why.contains("unless they carry a version the policy in force injects"),
        "{why}"
    );
    let status = with_policy(&template, base, Some(&state), false, at(200));
    let condition = policy_condition(&status).unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "ProofFailed")
    );
    assert!(
        condition.message.contains("violates PodSecurity")
            && condition.message.contains("guard refuses"),
        "{}",
        condition.message
    );
}

#[test]
fn a_required_template_selecting_every_namespace_says_so() {
    let condition = |yaml: &str| {
        let template = parse_template(yaml);
        let status = desired_status(&template, &outcome(&template), at(100));
        status
            .conditions
            .iter()
            .find(|c| c.type_ == WIDE_SELECTION)
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    let required =
        "metadata: {name: t, generation: 1}\nspec:\n  containers: [{name: c, image: i:1}]";
    assert_eq!(
        condition(required),
        Some(("True".into(), "NoNamespaceSelector".into()))
    );
    let excluding = "metadata: {name: t, generation: 1}\nspec:\n  namespaceSelector: {matchExpressions: [{key: tier, operator: NotIn, values: [system]}]}\n  containers: [{name: c, image: i:1}]";
    assert_eq!(
        condition(excluding),
        Some(("True".into(), "ExcludingSelectorOnly".into()))
    );
    let named = "metadata: {name: t, generation: 1}\nspec:\n  namespaceSelector: {matchExpressions: [{key: team, operator: In, values: [a]}]}\n  containers: [{name: c, image: i:1}]";
    assert_eq!(condition(named), None);
    let best_effort = "metadata: {name: t, generation: 1}\nspec:\n  failurePolicy: Ignore\n  containers: [{name: c, image: i:1}]";
    assert_eq!(condition(best_effort), None);
}

/// `valid()` at `generation` with the shipper's image `fluent-bit:<generation>`, and `status`.
fn shipper(generation: i64, status: Option<SidecarTemplateStatus>) -> SidecarTemplate {
    let mut template = valid();
    template.metadata.generation = Some(generation);
    template.spec.containers[0].image = Some(format!("fluent-bit:{generation}"));
    template.status = status;
    template
}

/// The leader's census of two Pods in `logs` injected with `carried`, counted against
/// `in_force`, as the census loop publishes it.
fn census_of(in_force: &SidecarTemplate, carried: &SidecarTemplate) -> crate::census::Counted {
    use injector_api::names::INJECTED_ANNOTATION;
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use kube::core::PartialObjectMeta;
    use std::sync::Arc;

    let (snapshot, _) = injector_core::registry::in_force::from_listing([in_force.clone()]);
    let record = compile(carried).unwrap();
    let record = format!("log-shipper@{}#{}", record.generation, record.fingerprint);
    let pods = crate::census::PodIndex::listed(["a", "b"].into_iter().map(|name| {
        let mut pod = PartialObjectMeta::<Pod>::default();
        pod.metadata.name = Some(name.to_owned());
        pod.metadata.namespace = Some("logs".to_owned());
        pod.metadata.annotations = Some([(INJECTED_ANNOTATION.to_owned(), record.clone())].into());
        pod
    }))
    .snapshot();
    let mut logs = PartialObjectMeta::<Namespace>::default();
    logs.metadata.name = Some("logs".to_owned());
    logs.metadata.labels = Some([("logs".to_owned(), "on".to_owned())].into());
    let census = crate::census::count(&snapshot, &pods, &[Arc::new(logs)], "sidecar-injector");
    crate::census::Counted {
        census: Arc::new(census),
        snapshot,
        pods,
        namespaces: kube::runtime::reflector::store().0,
    }
}

/// What the status loop writes for `template` given the leader's latest `census`.
fn composed(
    template: &SidecarTemplate,
    census: Option<&crate::census::Counted>,
) -> (SidecarTemplateStatus, Counts) {
    let (_, observed) = injector_core::registry::in_force::observe(template.clone(), None);
    let desired = desired_status_kept(template, &observed.outcome, None, at(100));
    let counts = counts_for(
        observed.generation_in_force(),
        census.map(|c| c.of("log-shipper")),
    );
    (with_counts(template, desired, counts), counts)
}

fn pods(injected: u32, current: u32, stale: u32) -> Option<injector_api::PodCounts> {
    Some(injector_api::PodCounts {
        injected,
        current,
        stale,
        missing: 0,
    })
}

#[test]
fn observed_generation_advances_only_with_counts_of_that_generation() {
    // Generation 2 in force and counted: its two Pods current.
    let two = shipper(2, None);
    let census_two = census_of(&two, &two);
    let (status, _) = composed(&two, Some(&census_two));
    assert_eq!(
        (status.observed_generation, status.pods),
        (Some(2), pods(2, 2, 0))
    );

    // An image edit: generation 3, while the latest census still counted generation 2. The
    // status keeps generation 2 beside generation 2's counts; the Ready condition says 3.
    let three = shipper(3, Some(status));
    let (status, counts) = composed(&three, Some(&census_two));
    assert_eq!(counts, Counts::Pending);
    assert_eq!(
        (status.observed_generation, status.pods),
        (Some(2), pods(2, 2, 0))
    );
    assert_eq!(ready(&status).observed_generation, Some(3));
    assert!(needs_update(three.status.as_ref(), &status));

    // Once counted against generation 3: both advance together, the Pods stale.
    let three = shipper(3, Some(status));
    let (status, counts) = composed(&three, Some(&census_of(&three, &two)));
    assert!(matches!(counts, Counts::Counted(tally) if tally.stale == 2));
    assert_eq!(
        (status.observed_generation, status.pods),
        (Some(3), pods(2, 0, 2))
    );
}

#[test]
fn without_a_census_nothing_is_claimed_but_a_template_not_in_force_has_no_counts() {
    // A new leader before its first count: what the cluster says stays.
    let before = shipper(2, None);
    let (counted, _) = composed(&before, Some(&census_of(&before, &before)));
    let edited = shipper(3, Some(counted));
    let (status, counts) = composed(&edited, None);
    assert_eq!(counts, Counts::Pending);
    assert_eq!(
        (status.observed_generation, status.pods),
        (Some(2), pods(2, 2, 0))
    );
    // A brand-new template gets no observedGeneration until it is counted.
    let (status, _) = composed(&shipper(1, None), None);
    assert_eq!((status.observed_generation, status.pods), (None, None));

    // Invalid and required: generation 2, kept in force, is what the census counts.
    let mut kept = invalid();
    kept.status = edited.status.clone();
    let census = census_of(&before, &before);
    let (status, counts) = composed(&kept, Some(&census));
    assert!(matches!(counts, Counts::Counted(_)));
    assert_eq!(
        (status.observed_generation, status.pods),
        (Some(4), pods(2, 2, 0))
    );
    // Invalid with no valid generation recorded: none is in force, so nothing is counted.
    if let Some(status) = &mut kept.status {
        status.last_valid = None;
    }
    let (status, counts) = composed(&kept, Some(&census));
    assert_eq!(counts, Counts::NotInForce);
    assert_eq!((status.observed_generation, status.pods), (Some(4), None));
}

#[test]
fn counts_are_for_the_generation_in_force() {
    let tally = Tally {
        current: 1,
        ..Tally::default()
    };
    assert_eq!(
        counts_for(Some(3), Some(Some((3, tally)))),
        Counts::Counted(tally)
    );
    assert_eq!(counts_for(Some(3), Some(Some((2, tally)))), Counts::Pending);
    // Counted while it was not in force (before it was created, or while invalid).
    assert_eq!(counts_for(Some(3), Some(None)), Counts::Pending);
    assert_eq!(counts_for(Some(3), None), Counts::Pending);
    // An invalid required template's kept generation is what is counted.
    assert_eq!(
        counts_for(Some(2), Some(Some((2, tally)))),
        Counts::Counted(tally)
    );
    assert_eq!(counts_for(None, Some(Some((2, tally)))), Counts::NotInForce);
}
