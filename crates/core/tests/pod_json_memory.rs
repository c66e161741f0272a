//! What decoding a Pod really allocates, against its allowance: the webhook reserves a
//! request's allowance before reading it, so the allowance must bound the allocation whatever
//! the Pod's shape, when decoding succeeds and when it runs out.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use injector_core::pod::json::{PodJsonError, Whole, allowance, decode};

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// The peak of bytes allocated while decoding `json`, keeping whole what `whole` says, within
/// its allowance, and what the decoder charged (or why it stopped).
fn measured(json: &str, whole: Whole<'_>) -> (usize, Result<usize, PodJsonError>) {
    let _profiler = dhat::Profiler::builder().testing().build();
    let charged = decode(json, allowance(json.len()), whole).map(|d| d.charged);
    (dhat::HeapStats::get().max_bytes, charged)
}

fn repeated(item: impl Fn(usize) -> String, until: usize) -> String {
    let mut out = String::with_capacity(until + 64);
    let mut i = 0;
    while out.len() < until {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&item(i));
        i += 1;
    }
    out
}

fn shapes(size: usize) -> Vec<(&'static str, String)> {
    let deep = format!("{}0{}", "[".repeat(120), "]".repeat(120));
    vec![
        (
            "typical pod",
            include_str!("../../../bench/fixtures/typical-pod.json").to_owned(),
        ),
        (
            "env entries",
            format!(
                r#"{{"spec":{{"containers":[{{"name":"a","env":[{}]}}]}}}}"#,
                repeated(|i| format!(r#"{{"name":"V{i}","value":"x"}}"#), size)
            ),
        ),
        (
            "empty maps",
            format!(
                r#"{{"spec":{{"containers":[{}]}}}}"#,
                repeated(|_| "{}".to_owned(), size)
            ),
        ),
        (
            "tiny maps",
            format!(
                r#"{{"spec":{{"volumes":[{}]}}}}"#,
                repeated(|_| r#"{"":0}"#.to_owned(), size)
            ),
        ),
        (
            "labels",
            format!(
                r#"{{"metadata":{{"labels":{{{}}}}}}}"#,
                repeated(|i| format!(r#""{i:x}":"""#), size)
            ),
        ),
        (
            "numbers",
            format!(
                r#"{{"spec":{{"containers":[{{"args":[{}]}}]}}}}"#,
                repeated(|_| "0".to_owned(), size)
            ),
        ),
        (
            "short strings",
            format!(
                r#"{{"spec":{{"containers":[{{"args":[{}]}}]}}}}"#,
                repeated(|_| r#""""#.to_owned(), size)
            ),
        ),
        (
            "long string",
            format!(
                r#"{{"metadata":{{"annotations":{{"a":"{}"}}}}}}"#,
                "x".repeat(size)
            ),
        ),
        (
            "escaped string",
            format!(
                r#"{{"metadata":{{"annotations":{{"a":"{}"}}}}}}"#,
                r"\u0041".repeat(size / 6)
            ),
        ),
        (
            "deep nesting",
            format!(
                r#"{{"spec":{{"containers":[{{"x":[{}]}}]}}}}"#,
                repeated(|_| deep.clone(), size)
            ),
        ),
        (
            "skipped",
            format!(
                r#"{{"status":[{}],"spec":{{"containers":[]}}}}"#,
                repeated(|_| r#"{"":0}"#.to_owned(), size)
            ),
        ),
    ]
}

#[test]
fn decoding_never_allocates_more_than_the_allowance() {
    // As the webhook decodes (containers in part) and whole.
    // As the webhook decodes when no template adds an item of the Pod's names, when every
    // name is one (so a container named after its other fields is decoded again whole), and
    // everything whole.
    let none: &dyn Fn(_, &str) -> bool = &|_, _| false;
    let all: &dyn Fn(_, &str) -> bool = &|_, _| true;
    for (read, whole) in [("among", Some(none)), ("again", Some(all)), ("whole", None)] {
        for size in [64 * 1024, 1024 * 1024] {
            for (shape, json) in shapes(size) {
                let (peak, charged) = measured(&json, whole);
                let allowance = allowance(json.len());
                eprintln!(
                    "{read} {shape:>15} {:>8} bytes: peak {peak:>9} ({:>5.1}x) charged {:?}",
                    json.len(),
                    peak as f64 / json.len() as f64,
                    charged.as_ref().map_err(|_| "out of allowance"),
                );
                assert!(peak <= allowance, "{read} {shape}: {peak} > {allowance}");
                if let Ok(charged) = charged {
                    assert!(peak <= charged + 1024, "{read} {shape}: {peak} > {charged}");
                }
            }
        }
    }
}
