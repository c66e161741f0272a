#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use http::{Method, Request, Response};
use k8s_openapi::jiff::SignedDuration;
use kube::client::Body;
use tokio::task::JoinHandle;

const NAMESPACE: &str = "sidecar-system";
const LEASE: &str = "sidecar-injector-leader";
const ME: &str = "injector-7d9f-abcde";
const OTHER: &str = "injector-7d9f-fghij";
const ITEM_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/sidecar-system/leases/sidecar-injector-leader";
const COLLECTION_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/sidecar-system/leases";

const LEASE_DURATION: Duration = Duration::from_millis(300);
const RENEW_INTERVAL: Duration = Duration::from_millis(20);
const RENEW_DEADLINE: Duration = Duration::from_millis(100);
/// How late a paused-clock timer may fire (tokio's timers have millisecond resolution).
const TIMER_SLACK: Duration = Duration::from_millis(5);

fn config() -> LeaderElectionConfig {
    LeaderElectionConfig {
        lease_duration: LEASE_DURATION,
        renew_interval: RENEW_INTERVAL,
        renew_deadline: RENEW_DEADLINE,
        ..LeaderElectionConfig::new(LEASE, NAMESPACE, ME)
    }
}

/// A fixed instant, `seconds` after 2023-11-14T22:13:20Z.
fn at(seconds: i64) -> MicroTime {
    MicroTime(Timestamp::from_second(1_700_000_000 + seconds).unwrap())
}

/// Now, give or take `offset`, at the microsecond precision the API server keeps.
fn wall_clock(offset: SignedDuration) -> MicroTime {
    let now = Timestamp::now().checked_add(offset).unwrap();
    MicroTime(Timestamp::from_microsecond(now.as_microsecond()).unwrap())
}

fn lease(spec: LeaseSpec) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(LEASE.into()),
            namespace: Some(NAMESPACE.into()),
            resource_version: Some("41".into()),
            uid: Some("6f1c2d2e-0000-0000-0000-000000000000".into()),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
    }
}

fn held_by(holder: &str, renewed: MicroTime, seconds: i32) -> Lease {
    lease(LeaseSpec {
        holder_identity: Some(holder.into()),
        acquire_time: Some(renewed.clone()),
        renew_time: Some(renewed),
        lease_duration_seconds: Some(seconds),
        lease_transitions: Some(3),
        ..LeaseSpec::default()
    })
}

fn spec(lease: &Lease) -> &LeaseSpec {
    lease.spec.as_ref().unwrap()
}

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn no_lease_is_created() {
    assert_eq!(
        decide(None, ME, Duration::ZERO, DEFAULT_LEASE_DURATION),
        Decision::Create
    );
}

#[test]
fn our_lease_is_renewed_even_when_expired() {
    let fresh = held_by(ME, at(0), 15);
    assert_eq!(
        decide(Some(&fresh), ME, SECOND, DEFAULT_LEASE_DURATION),
        Decision::Renew
    );
    assert_eq!(
        decide(Some(&fresh), ME, 3600 * SECOND, DEFAULT_LEASE_DURATION),
        Decision::Renew
    );
}

#[test]
fn a_lease_of_another_is_waited_for_until_it_stays_unchanged_for_its_duration() {
    let held = held_by(OTHER, at(0), 15);
    let wait = |seconds: u32| Decision::Wait {
        holder: OTHER.into(),
        remaining: seconds * SECOND,
    };
    assert_eq!(
        decide(Some(&held), ME, Duration::ZERO, DEFAULT_LEASE_DURATION),
        wait(15)
    );
    assert_eq!(
        decide(Some(&held), ME, 14 * SECOND, DEFAULT_LEASE_DURATION),
        wait(1)
    );
    assert_eq!(
        wait(15).to_string(),
        "the lease is held by injector-7d9f-fghij for another 15s unless renewed"
    );
    // Its times, written by another clock, do not count: long past or far ahead.
    for renewed in [at(-86_400), at(86_400), MicroTime(Timestamp::MAX)] {
        let lease = held_by(OTHER, renewed, 15);
        assert_eq!(
            decide(Some(&lease), ME, 14 * SECOND, DEFAULT_LEASE_DURATION),
            wait(1)
        );
    }
}

#[test]
fn decide_takes_over_a_lease_of_another_unchanged_for_its_duration() {
    let held = held_by(OTHER, at(0), 15);
    let take_over = Decision::TakeOver {
        previous: Some(OTHER.into()),
    };
    assert_eq!(
        decide(Some(&held), ME, 15 * SECOND, DEFAULT_LEASE_DURATION),
        take_over,
        "expired after exactly leaseDurationSeconds unchanged"
    );
    assert_eq!(
        decide(Some(&held), ME, 3600 * SECOND, DEFAULT_LEASE_DURATION),
        take_over
    );
    assert_eq!(
        take_over.to_string(),
        "took over the lease injector-7d9f-fghij let expire"
    );
}

#[test]
fn a_released_lease_is_taken_over_at_once() {
    let released_at_zero = released(&held_by(OTHER, at(0), 15), &at(0));
    for lease in [
        released_at_zero,
        lease(LeaseSpec {
            holder_identity: Some(String::new()),
            renew_time: Some(at(0)),
            lease_duration_seconds: Some(3600),
            ..LeaseSpec::default()
        }),
        lease(LeaseSpec::default()),
        Lease {
            spec: None,
            ..held_by(OTHER, at(0), 15)
        },
    ] {
        assert_eq!(
            decide(Some(&lease), ME, Duration::ZERO, DEFAULT_LEASE_DURATION),
            Decision::TakeOver { previous: None },
            "{lease:?}"
        );
    }
}

#[test]
fn missing_fields_of_another_holders_lease() {
    // No duration, or a nonsensical one: ours stands in.
    for seconds in [None, Some(0), Some(-5)] {
        let mut lease = held_by(OTHER, at(0), 0);
        lease.spec.as_mut().unwrap().lease_duration_seconds = seconds;
        assert_eq!(
            decide(Some(&lease), ME, 5 * SECOND, 20 * SECOND),
            Decision::Wait {
                holder: OTHER.into(),
                remaining: 15 * SECOND,
            },
            "{seconds:?}"
        );
    }
    // Neither time: judged like any other, by how long it stays unchanged.
    let mut timeless = held_by(OTHER, at(10), 15);
    let spec = timeless.spec.as_mut().unwrap();
    spec.renew_time = None;
    spec.acquire_time = None;
    assert!(matches!(
        decide(Some(&timeless), ME, Duration::ZERO, DEFAULT_LEASE_DURATION),
        Decision::Wait { .. }
    ));
}

#[test]
fn the_observer_counts_from_the_last_change_it_saw() {
    let start = Instant::now();
    let later = |seconds: u32| start + seconds * SECOND;
    let mut observer = LeaseObserver::default();
    let lease = held_by(OTHER, at(0), 15);
    assert_eq!(observer.observe(&lease, later(0)), Duration::ZERO);
    assert_eq!(observer.observe(&lease, later(4)), 4 * SECOND);
    // Any write: a new resourceVersion, holder or renewTime starts the count again.
    let mut renewed = lease.clone();
    renewed.metadata.resource_version = Some("42".into());
    assert_eq!(observer.observe(&renewed, later(5)), Duration::ZERO);
    assert_eq!(observer.observe(&renewed, later(7)), 2 * SECOND);
    let mut moved = renewed.clone();
    moved.spec.as_mut().unwrap().renew_time = Some(at(-3600));
    assert_eq!(observer.observe(&moved, later(8)), Duration::ZERO);
    let mut taken = moved.clone();
    taken.spec.as_mut().unwrap().holder_identity = Some(ME.into());
    assert_eq!(observer.observe(&taken, later(9)), Duration::ZERO);
    assert_eq!(observer.observe(&taken, later(10)), SECOND);
}

#[test]
fn lease_duration_is_whole_seconds_rounded_up() {
    assert_eq!(lease_duration_seconds(Duration::from_secs(15)), 15);
    assert_eq!(lease_duration_seconds(Duration::from_millis(15_001)), 16);
    assert_eq!(lease_duration_seconds(Duration::from_millis(10)), 1);
    assert_eq!(lease_duration_seconds(Duration::ZERO), 1);
    assert_eq!(lease_duration_seconds(Duration::MAX), i32::MAX);
}

#[test]
fn creating_writes_a_new_lease_held_by_us() {
    let lease = next_lease(None, &Decision::Create, &config(), &at(0)).unwrap();
    assert_eq!(lease.metadata.name.as_deref(), Some(LEASE));
    assert_eq!(lease.metadata.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!(lease.metadata.resource_version, None);
    assert_eq!(
        lease.spec,
        Some(LeaseSpec {
            holder_identity: Some(ME.into()),
            acquire_time: Some(at(0)),
            renew_time: Some(at(0)),
            lease_duration_seconds: Some(1),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        })
    );
    assert_eq!(
        decide(Some(&lease), ME, Duration::ZERO, LEASE_DURATION),
        Decision::Renew
    );
}

#[test]
fn renewing_keeps_the_acquisition_and_moves_the_renewal() {
    let mut current = held_by(ME, at(0), 15);
    current.spec.as_mut().unwrap().preferred_holder = Some("kept".into());
    let renewed = next_lease(
        Some(&current),
        &Decision::Renew,
        &LeaderElectionConfig::new(LEASE, NAMESPACE, ME),
        &at(2),
    )
    .unwrap();
    assert_eq!(
        renewed.metadata, current.metadata,
        "keeps the resourceVersion"
    );
    assert_eq!(
        renewed.spec,
        Some(LeaseSpec {
            holder_identity: Some(ME.into()),
            acquire_time: Some(at(0)),
            renew_time: Some(at(2)),
            lease_duration_seconds: Some(15),
            lease_transitions: Some(3),
            preferred_holder: Some("kept".into()),
            ..LeaseSpec::default()
        })
    );
    // No acquireTime (written by someone else): the renewal supplies one.
    current.spec.as_mut().unwrap().acquire_time = None;
    let renewed = next_lease(Some(&current), &Decision::Renew, &config(), &at(2)).unwrap();
    assert_eq!(spec(&renewed).acquire_time, Some(at(2)));
}

#[test]
fn taking_over_counts_a_transition() {
    let current = held_by(OTHER, at(0), 15);
    let decision = decide(Some(&current), ME, 60 * SECOND, LEASE_DURATION);
    let taken = next_lease(Some(&current), &decision, &config(), &at(60)).unwrap();
    assert_eq!(taken.metadata, current.metadata);
    assert_eq!(
        taken.spec,
        Some(LeaseSpec {
            holder_identity: Some(ME.into()),
            acquire_time: Some(at(60)),
            renew_time: Some(at(60)),
            lease_duration_seconds: Some(1),
            lease_transitions: Some(4),
            ..LeaseSpec::default()
        })
    );
    // A released lease, and one that never counted transitions.
    let mut free = released(&current, &at(5));
    free.spec.as_mut().unwrap().lease_transitions = None;
    let decision = decide(Some(&free), ME, SECOND, LEASE_DURATION);
    assert_eq!(decision, Decision::TakeOver { previous: None });
    let taken = next_lease(Some(&free), &decision, &config(), &at(6)).unwrap();
    assert_eq!(spec(&taken).lease_transitions, Some(1));
    assert_eq!(spec(&taken).holder_identity.as_deref(), Some(ME));
}

#[test]
fn the_owner_is_set_on_creation_and_restored_on_renewal() {
    let owner = OwnerReference {
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: "ClusterRole".into(),
        name: "sidecar-injector".into(),
        uid: "role-uid".into(),
        ..OwnerReference::default()
    };
    let config = LeaderElectionConfig {
        owner: Some(owner.clone()),
        ..config()
    };
    let created = next_lease(None, &Decision::Create, &config, &at(0)).unwrap();
    assert_eq!(created.metadata.owner_references, Some(vec![owner.clone()]));
    // A Lease written before the owner was configured gets it on its next renewal.
    let current = held_by(ME, at(0), 1);
    let renewed = next_lease(Some(&current), &Decision::Renew, &config, &at(1)).unwrap();
    assert_eq!(renewed.metadata.owner_references, Some(vec![owner]));
}

#[test]
fn waiting_writes_nothing() {
    let current = held_by(OTHER, at(0), 15);
    let decision = decide(Some(&current), ME, SECOND, LEASE_DURATION);
    assert!(matches!(decision, Decision::Wait { .. }));
    assert_eq!(
        next_lease(Some(&current), &decision, &config(), &at(1)),
        None
    );
}

#[test]
fn releasing_clears_the_holder_and_keeps_the_history() {
    let current = held_by(ME, at(0), 15);
    let lease = released(&current, &at(7));
    assert_eq!(lease.metadata, current.metadata);
    assert_eq!(
        lease.spec,
        Some(LeaseSpec {
            holder_identity: None,
            acquire_time: Some(at(0)),
            renew_time: Some(at(7)),
            lease_duration_seconds: Some(1),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        })
    );
    let json = serde_json::to_value(&lease).unwrap();
    assert!(json["spec"].get("holderIdentity").is_none(), "{json}");
}

#[test]
fn configuration_is_validated() {
    assert!(
        LeaderElectionConfig::new(LEASE, NAMESPACE, ME)
            .validate()
            .is_ok()
    );
    assert!(config().validate().is_ok());
    let invalid = |edit: &dyn Fn(&mut LeaderElectionConfig)| {
        let mut config = config();
        edit(&mut config);
        match config.validate() {
            Err(LeaderError::InvalidConfig(reason)) => reason,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        invalid(&|c| c.lease_name.clear()),
        "the lease name is empty"
    );
    assert_eq!(invalid(&|c| c.namespace.clear()), "the namespace is empty");
    assert_eq!(invalid(&|c| c.identity.clear()), "the identity is empty");
    assert_eq!(
        invalid(&|c| c.renew_interval = Duration::ZERO),
        "the renew interval is zero"
    );
    assert_eq!(
        invalid(&|c| c.renew_interval = RENEW_DEADLINE),
        "the renew interval (100ms) must be shorter than the renew deadline (100ms)"
    );
    assert_eq!(
        invalid(&|c| c.lease_duration = RENEW_DEADLINE),
        "the renew deadline (100ms) must be shorter than the lease duration (100ms)"
    );
}

// The API server, played by the tests through kube's mock service.

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Reply = tower_test::mock::SendResponse<Response<Body>>;

struct Fixture {
    server: Handle,
    leading: watch::Receiver<bool>,
    stop: CancellationToken,
    task: JoinHandle<Result<(), LeaderError>>,
}

fn start() -> Fixture {
    let (service, server) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let (sender, leading) = watch::channel(false);
    let stop = CancellationToken::new();
    let task = tokio::spawn(campaign(client, config(), sender, stop.clone()));
    Fixture {
        server,
        leading,
        stop,
        task,
    }
}

impl Fixture {
    /// The next request, checked to be `method` on `path`, with the Lease it carries.
    async fn expect(&mut self, method: Method, path: &str) -> (Option<Lease>, Reply) {
        let (request, reply) = self
            .server
            .next_request()
            .await
            .expect("another request to the API server");
        assert_eq!(request.method(), method, "{}", request.uri());
        assert_eq!(request.uri().path(), path);
        if method != Method::GET {
            let query = request.uri().query().unwrap_or_default();
            assert!(query.contains("fieldManager=sidecar-injector"), "{query}");
        }
        let body = request.into_body().collect_bytes().await.unwrap();
        let lease = (!body.is_empty()).then(|| serde_json::from_slice(&body).unwrap());
        (lease, reply)
    }

    async fn expect_get(&mut self) -> Reply {
        let (body, reply) = self.expect(Method::GET, ITEM_PATH).await;
        assert_eq!(body, None);
        reply
    }

    async fn expect_put(&mut self) -> (Lease, Reply) {
        let (lease, reply) = self.expect(Method::PUT, ITEM_PATH).await;
        (lease.expect("a Lease in the PUT"), reply)
    }

    /// Answers every read with `current()` until a write comes (within 1,000 rounds); returns
    /// the Lease written, unanswered.
    async fn serve_until_written(&mut self, mut current: impl FnMut() -> Lease) -> (Lease, Reply) {
        for _ in 0..1_000 {
            let (request, reply) = self.server.next_request().await.expect("a request");
            if request.method() == Method::PUT {
                let body = request.into_body().collect_bytes().await.unwrap();
                return (serde_json::from_slice(&body).unwrap(), reply);
            }
            assert_eq!(request.method(), Method::GET);
            ok(reply, &current());
        }
        panic!("no write within 1,000 rounds");
    }

    /// Plays the API server through the creation of the Lease; returns the Lease stored.
    async fn acquire_by_creating(&mut self) -> Lease {
        not_found(self.expect_get().await);
        let (created, reply) = self.expect(Method::POST, COLLECTION_PATH).await;
        let created = stored(&created.expect("a Lease in the POST"), "1");
        ok(reply, &created);
        self.leading.wait_for(|leading| *leading).await.unwrap();
        created
    }

    /// Stops the election while leading, playing the API server through the release of
    /// `current`.
    async fn stop_releasing(mut self, current: &Lease) {
        self.stop.cancel();
        ok(self.expect_get().await, current);
        let (release, reply) = self.expect_put().await;
        assert!(!*self.leading.borrow(), "stopped leading before releasing");
        assert_eq!(spec(&release).holder_identity, None);
        ok(reply, &stored(&release, "99"));
        assert!(self.stop().await.is_ok());
    }

    /// Stops the election and returns what `run` returned; no request may follow.
    async fn stop(mut self) -> Result<(), LeaderError> {
        self.stop.cancel();
        let result = self.task.await.unwrap();
        assert!(
            self.server.next_request().await.is_none(),
            "no request after run returned"
        );
        assert!(!*self.leading.borrow());
        result
    }
}

/// `lease` as the API server stores it.
fn stored(lease: &Lease, resource_version: &str) -> Lease {
    let mut lease = lease.clone();
    lease.metadata.resource_version = Some(resource_version.into());
    lease.metadata.uid = Some("6f1c2d2e-0000-0000-0000-000000000000".into());
    lease
}

fn ok(reply: Reply, lease: &Lease) {
    reply.send_response(
        Response::builder()
            .status(200)
            .body(Body::from(serde_json::to_vec(lease).unwrap()))
            .unwrap(),
    );
}

fn failure(reply: Reply, code: u16, reason: &str) {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": format!("{reason} (test)"),
        "reason": reason, "code": code,
    });
    reply.send_response(
        Response::builder()
            .status(code)
            .body(Body::from(serde_json::to_vec(&status).unwrap()))
            .unwrap(),
    );
}

fn not_found(reply: Reply) {
    failure(reply, 404, "NotFound");
}

#[tokio::test(start_paused = true)]
async fn an_absent_lease_is_created_and_we_lead() {
    let mut api = start();
    not_found(api.expect_get().await);
    let (created, reply) = api.expect(Method::POST, COLLECTION_PATH).await;
    let created = created.unwrap();
    assert!(!*api.leading.borrow(), "not before the write succeeds");
    assert_eq!(created.metadata.name.as_deref(), Some(LEASE));
    let spec = spec(&created);
    assert_eq!(spec.holder_identity.as_deref(), Some(ME));
    assert_eq!(spec.lease_duration_seconds, Some(1));
    assert_eq!(spec.lease_transitions, Some(0));
    assert!(spec.renew_time.is_some());
    assert_eq!(spec.acquire_time, spec.renew_time);
    ok(reply, &stored(&created, "1"));
    api.leading.wait_for(|leading| *leading).await.unwrap();

    // Still leading after the next renewal.
    let reply = api.expect_get().await;
    ok(reply, &stored(&created, "1"));
    let (renewed, reply) = api.expect_put().await;
    let renewed = stored(&renewed, "2");
    ok(reply, &renewed);
    let reply = api.expect_get().await;
    assert!(*api.leading.borrow());
    ok(reply, &renewed);
    let (renewed, reply) = api.expect_put().await;
    let renewed = stored(&renewed, "3");
    ok(reply, &renewed);
    api.stop_releasing(&renewed).await;
}

#[tokio::test(start_paused = true)]
async fn a_fresh_lease_of_another_is_left_alone() {
    let mut api = start();
    let held = held_by(OTHER, wall_clock(SignedDuration::ZERO), 3600);
    for _ in 0..3 {
        ok(api.expect_get().await, &held);
    }
    // The third answer may still be in flight; the fourth request proves it was read.
    let reply = api.expect_get().await;
    assert!(!api.leading.has_changed().unwrap(), "never published");
    assert!(!*api.leading.borrow());
    drop(reply);
    assert!(
        api.stop().await.is_ok(),
        "a follower has nothing to release"
    );
}

/// A Lease of another holder whose clock is `offset` away from ours.
fn held_with_clock_off(offset: i64, version: u64) -> Lease {
    let mut lease = held_by(OTHER, wall_clock(SignedDuration::from_secs(offset)), 1);
    lease.metadata.resource_version = Some(version.to_string());
    lease
}

const CLOCK_OFFSETS: [i64; 2] = [-3600, 3600];

#[tokio::test(start_paused = true)]
async fn a_lease_of_another_unchanged_for_its_duration_is_taken_over_whatever_its_clock() {
    for offset in CLOCK_OFFSETS {
        let mut api = start();
        // Its renewTime, an hour behind or ahead of ours, says nothing: counted from when this
        // replica first saw it, it expires after its one second.
        let stale = held_with_clock_off(offset, 41);
        let first_seen = Instant::now();
        let (taken, reply) = api.serve_until_written(|| stale.clone()).await;
        let waited = first_seen.elapsed();
        assert!(waited >= Duration::from_secs(1), "{offset}: {waited:?}");
        assert!(
            waited < Duration::from_secs(1) + RENEW_INTERVAL + TIMER_SLACK,
            "{offset}: {waited:?}"
        );
        assert!(!*api.leading.borrow());
        assert_eq!(taken.metadata.resource_version.as_deref(), Some("41"));
        let spec = spec(&taken);
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.lease_duration_seconds, Some(1));
        assert_eq!(spec.acquire_time, spec.renew_time);
        ok(reply, &stored(&taken, "42"));
        api.leading.wait_for(|leading| *leading).await.unwrap();
        api.stop_releasing(&stored(&taken, "42")).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_lease_another_keeps_renewing_is_never_taken_over_whatever_its_clock() {
    for offset in CLOCK_OFFSETS {
        let mut api = start();
        let started = Instant::now();
        // Renewed every round (a new resourceVersion), its renewTime an hour off ours and its
        // duration one second: 250 rounds are five seconds, five durations.
        for version in 41..291 {
            ok(
                api.expect_get().await,
                &held_with_clock_off(offset, version),
            );
        }
        assert!(started.elapsed() >= Duration::from_secs(4), "{offset}");
        drop(api.expect_get().await);
        assert!(!api.leading.has_changed().unwrap(), "{offset}: never led");
        assert!(api.stop().await.is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn renewing_keeps_the_acquire_time_and_bumps_the_renew_time() {
    let mut api = start();
    let acquired = wall_clock(SignedDuration::from_secs(-60));
    let renewed = wall_clock(SignedDuration::from_secs(-1));
    let mut ours = held_by(ME, renewed.clone(), 15);
    ours.spec.as_mut().unwrap().acquire_time = Some(acquired.clone());
    ok(api.expect_get().await, &ours);
    let (renewal, reply) = api.expect_put().await;
    assert_eq!(renewal.metadata.resource_version.as_deref(), Some("41"));
    let spec = spec(&renewal);
    assert_eq!(spec.holder_identity.as_deref(), Some(ME));
    assert_eq!(spec.acquire_time, Some(acquired));
    assert!(spec.renew_time.as_ref().unwrap() > &renewed);
    assert_eq!(spec.lease_transitions, Some(3), "not a transition");
    ok(reply, &stored(&renewal, "42"));
    api.leading.wait_for(|leading| *leading).await.unwrap();

    // The next renewal carries the new resourceVersion and moves renewTime again.
    ok(api.expect_get().await, &stored(&renewal, "42"));
    let (again, reply) = api.expect_put().await;
    assert_eq!(again.metadata.resource_version.as_deref(), Some("42"));
    assert!(self::spec(&again).renew_time >= spec.renew_time);
    assert_eq!(self::spec(&again).acquire_time, spec.acquire_time);
    ok(reply, &stored(&again, "43"));
    api.stop_releasing(&stored(&again, "43")).await;
}

#[tokio::test(start_paused = true)]
async fn a_conflict_is_not_leading_and_not_an_error() {
    let mut api = start();
    let expired = released(
        &held_by(OTHER, wall_clock(SignedDuration::ZERO), 15),
        &wall_clock(SignedDuration::ZERO),
    );

    // Losing the race to take over.
    ok(api.expect_get().await, &expired);
    let (_, reply) = api.expect_put().await;
    failure(reply, 409, "Conflict");
    // Retried on the next round, not returned as an error.
    ok(api.expect_get().await, &expired);
    assert!(!api.leading.has_changed().unwrap());
    let (taken, reply) = api.expect_put().await;
    ok(reply, &stored(&taken, "42"));
    api.leading.wait_for(|leading| *leading).await.unwrap();

    // A leader whose renewal conflicts stops leading.
    ok(api.expect_get().await, &stored(&taken, "42"));
    let (_, reply) = api.expect_put().await;
    failure(reply, 409, "Conflict");
    // Before the next round: the conflict itself ended the leadership.
    let reply = api.expect_get().await;
    assert!(!*api.leading.borrow());

    let winner = held_by(OTHER, wall_clock(SignedDuration::ZERO), 3600);
    ok(reply, &winner);
    drop(api.expect_get().await);
    assert!(!*api.leading.borrow());
    assert!(api.stop().await.is_ok(), "not leading: nothing to release");
}

#[tokio::test(start_paused = true)]
async fn losing_the_race_to_create_is_not_leading() {
    let mut api = start();
    not_found(api.expect_get().await);
    let (_, reply) = api.expect(Method::POST, COLLECTION_PATH).await;
    failure(reply, 409, "AlreadyExists");
    let winner = held_by(OTHER, wall_clock(SignedDuration::ZERO), 3600);
    ok(api.expect_get().await, &winner);
    drop(api.expect_get().await);
    assert!(!api.leading.has_changed().unwrap());
    assert!(api.stop().await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn another_holder_ends_our_leadership() {
    let mut api = start();
    api.acquire_by_creating().await;
    let usurper = held_by(OTHER, wall_clock(SignedDuration::ZERO), 3600);
    ok(api.expect_get().await, &usurper);
    // Before the next round, not at the renew deadline.
    drop(api.expect_get().await);
    assert!(!*api.leading.borrow());
    assert!(api.stop().await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_stop_leading_at_the_renew_deadline() {
    let mut api = start();
    // The deadline counts from the start of the successful attempt, when the renewTime
    // that others count from was taken, not from when its answer came back.
    let started = Instant::now();
    not_found(api.expect_get().await);
    let (created, reply) = api.expect(Method::POST, COLLECTION_PATH).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let created = stored(&created.unwrap(), "1");
    ok(reply, &created);
    api.leading.wait_for(|leading| *leading).await.unwrap();

    // Errors of every kind: still the leader until the deadline.
    let reply = api.expect_get().await;
    failure(reply, 500, "InternalError");
    let reply = api.expect_get().await;
    reply.send_error("connection refused");
    ok(api.expect_get().await, &created);
    let (_, reply) = api.expect_put().await;
    failure(reply, 503, "ServiceUnavailable");
    let reply = api.expect_get().await;
    assert!(*api.leading.borrow(), "within the deadline");
    failure(reply, 500, "InternalError");

    loop {
        tokio::select! {
            changed = api.leading.changed() => {
                changed.unwrap();
                break;
            }
            request = api.server.next_request() => {
                let (_, reply) = request.unwrap();
                failure(reply, 500, "InternalError");
            }
        }
    }
    assert!(!*api.leading.borrow());
    let lost_after = started.elapsed();
    assert!(lost_after >= RENEW_DEADLINE, "{lost_after:?}");
    assert!(lost_after < RENEW_DEADLINE + TIMER_SLACK, "{lost_after:?}");

    // Still trying, and leading again once the API server is back.
    ok(api.expect_get().await, &created);
    let (renewed, reply) = api.expect_put().await;
    ok(reply, &stored(&renewed, "2"));
    api.leading.wait_for(|leading| *leading).await.unwrap();
    api.stop_releasing(&stored(&renewed, "2")).await;
}

#[tokio::test(start_paused = true)]
async fn a_hanging_api_server_stops_leading_at_the_renew_deadline() {
    let mut api = start();
    api.acquire_by_creating().await;
    let acquired = Instant::now();
    // Never answered: the attempt is cut off at the leader's deadline.
    let hanging = api.expect_get().await;
    api.leading.wait_for(|leading| !*leading).await.unwrap();
    let lost_after = acquired.elapsed();
    assert!(lost_after >= RENEW_DEADLINE, "{lost_after:?}");
    assert!(lost_after < RENEW_DEADLINE + TIMER_SLACK, "{lost_after:?}");
    drop(hanging);
    drop(api.expect_get().await);
    assert!(api.stop().await.is_ok(), "not leading: nothing to release");
}

#[tokio::test(start_paused = true)]
async fn stopping_while_leading_releases_the_lease() {
    let mut api = start();
    let created = api.acquire_by_creating().await;
    api.stop.cancel();

    ok(api.expect_get().await, &created);
    let (release, reply) = api.expect_put().await;
    assert!(!*api.leading.borrow(), "stopped leading before releasing");
    assert_eq!(release.metadata.resource_version.as_deref(), Some("1"));
    let spec = spec(&release);
    assert_eq!(spec.holder_identity, None);
    assert_eq!(spec.lease_duration_seconds, Some(1));
    assert_eq!(spec.lease_transitions, Some(0));
    assert_eq!(spec.acquire_time, self::spec(&created).acquire_time);
    assert!(spec.renew_time >= self::spec(&created).renew_time);
    ok(reply, &stored(&release, "2"));
    assert!(api.stop().await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn stopping_does_not_release_a_lease_taken_by_another() {
    let mut api = start();
    api.acquire_by_creating().await;
    api.stop.cancel();
    ok(
        api.expect_get().await,
        &held_by(OTHER, wall_clock(SignedDuration::ZERO), 15),
    );
    assert!(api.stop().await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_failed_release_is_reported() {
    let mut api = start();
    let created = api.acquire_by_creating().await;
    api.stop.cancel();
    ok(api.expect_get().await, &created);
    let (_, reply) = api.expect_put().await;
    failure(reply, 500, "InternalError");
    assert!(matches!(
        api.stop().await,
        Err(LeaderError::Release { lease, .. }) if lease == LEASE
    ));

    let mut api = start();
    api.acquire_by_creating().await;
    api.stop.cancel();
    let _hanging = api.expect_get().await;
    let result = api.task.await.unwrap();
    assert!(
        matches!(result, Err(LeaderError::ReleaseTimedOut { after, .. }) if after == RENEW_DEADLINE),
        "{result:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_invalid_configuration_is_refused_before_any_request() {
    let (service, mut server) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let (sender, leading) = watch::channel(true);
    let mut config = config();
    config.renew_deadline = LEASE_DURATION;
    let result = campaign(client, config, sender, CancellationToken::new()).await;
    assert!(matches!(result, Err(LeaderError::InvalidConfig(_))));
    assert!(server.next_request().await.is_none());
    assert!(*leading.borrow(), "untouched");
}

#[tokio::test(start_paused = true)]
async fn a_stale_true_is_withdrawn_at_start() {
    let (service, _server) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let (sender, mut leading) = watch::channel(true);
    let stop = CancellationToken::new();
    stop.cancel();
    let result = campaign(client, config(), sender, stop).await;
    assert!(result.is_ok());
    assert!(!*leading.borrow_and_update());
}
