//! Hostile request bodies against the binary as it is shipped (its allocator included): 3 MiB
//! AdmissionReviews shaped to cost the most memory, 8 at once, answered without the server's
//! peak RSS growing past 128 MiB, and the server serving normally afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{Served, examples};

const SIZE: usize = 3 * 1024 * 1024 - 4096;

/// `item(i)` for i = 0.., comma-separated, until `SIZE` bytes.
fn items(item: impl Fn(usize) -> String) -> String {
    let mut out = String::with_capacity(SIZE + 64);
    let mut i = 0;
    while out.len() < SIZE {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&item(i));
        i += 1;
    }
    out
}

/// An AdmissionReview of a Pod CREATE whose `object` (or `oldObject`) is `object`.
fn review(uid: &str, object: &str, old_object: &str) -> Vec<u8> {
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"{uid}","kind":{{"group":"","version":"v1","kind":"Pod"}},"namespace":"default","operation":"CREATE","oldObject":{old_object},"object":{object}}}}}"#
    )
    .into_bytes()
}

fn pod(metadata: &str, container: &str) -> String {
    format!(
        r#"{{"metadata":{{"name":"p","labels":{{"app":"web"}}{metadata}}},"spec":{{"containers":[{{"name":"app","image":"nginx"{container}}}]}}}}"#
    )
}

/// The shapes: wide lists, many small objects, long strings, deep-but-legal nesting, in the
/// fields the planner reads and in those it skips.
fn hostile_bodies() -> Vec<(&'static str, Vec<u8>)> {
    let deep = format!("{}0{}", "[".repeat(100), "]".repeat(100));
    vec![
        (
            "object a list of tiny objects",
            review(
                "h1",
                &format!("[{}]", items(|_| r#"{"":0}"#.into())),
                "null",
            ),
        ),
        (
            "env of tiny objects",
            review(
                "h2",
                &pod(
                    "",
                    &format!(r#","env":[{}]"#, items(|_| r#"{"":0}"#.into())),
                ),
                "null",
            ),
        ),
        (
            "many labels",
            review(
                "h3",
                &pod(
                    &format!(
                        r#","annotations":{{{}}}"#,
                        items(|i| format!(r#""{i:x}":"""#))
                    ),
                    "",
                ),
                "null",
            ),
        ),
        (
            "wide list of numbers",
            review(
                "h4",
                &pod("", &format!(r#","args":[{}]"#, items(|_| "0".into()))),
                "null",
            ),
        ),
        (
            "long string",
            review(
                "h5",
                &pod(
                    &format!(r#","annotations":{{"a":"{}"}}"#, "x".repeat(SIZE)),
                    "",
                ),
                "null",
            ),
        ),
        (
            "deep nesting",
            review(
                "h6",
                &pod("", &format!(r#","x":[{}]"#, items(|_| deep.clone()))),
                "null",
            ),
        ),
        (
            "skipped oldObject",
            review(
                "h7",
                &pod("", ""),
                &format!("[{}]", items(|_| r#"{"":[]}"#.into())),
            ),
        ),
        (
            "empty objects",
            review(
                "h8",
                &pod("", &format!(r#","ports":[{}]"#, items(|_| "{}".into()))),
                "null",
            ),
        ),
    ]
}

fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn status_and_body(response: &str) -> (u16, &str) {
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response:.200}"));
    let body = response.find("\r\n\r\n").map_or("", |i| &response[i + 4..]);
    (status, body)
}

#[test]
fn hostile_bodies_are_answered_within_bounded_memory() {
    let served = Served::start(&examples(), &[]);
    let pid = served.child.0.id();
    let idle = peak_rss_kib(pid);
    let bodies = hostile_bodies();
    for (shape, body) in &bodies {
        assert!(body.len() <= 3 * 1024 * 1024, "{shape}: {}", body.len());
    }

    std::thread::scope(|scope| {
        let served = &served;
        let answers: Vec<_> = bodies
            .iter()
            .map(|(shape, body)| (shape, scope.spawn(move || served.post("/mutate", body))))
            .collect();
        for (shape, answer) in answers {
            let response = answer.join().unwrap();
            let (status, body) = status_and_body(&response);
            match status {
                200 => {
                    let review: serde_json::Value = serde_json::from_str(body).unwrap();
                    assert!(
                        review["response"]["allowed"].is_boolean(),
                        "{shape}: {body:.300}"
                    );
                    eprintln!(
                        "{shape}: 200, allowed {}, {:.160}",
                        review["response"]["allowed"], review["response"]["status"]["message"]
                    );
                }
                400..=499 => eprintln!("{shape}: {status} {body:.160}"),
                _ => panic!("{shape}: {status} {body:.300}"),
            }
        }
    });

    let peak = peak_rss_kib(pid);
    eprintln!(
        "peak RSS: idle {} MiB, after 8 hostile bodies at once {} MiB",
        idle / 1024,
        peak / 1024
    );
    assert!(peak < 128 * 1024, "peak RSS {} MiB", peak / 1024);

    // Still serving.
    let normal = review(
        "after",
        &pod(
            r#","annotations":{"sidecar.dev/templates":"native-proxy"}"#,
            "",
        ),
        "null",
    );
    let response = served.post("/mutate", &normal);
    let (status, body) = status_and_body(&response);
    assert_eq!(status, 200, "{body}");
    let review: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(review["response"]["allowed"], true, "{body}");
}
