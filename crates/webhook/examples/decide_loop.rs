//! `decide` on the typical review of `just bench-webhook`, N times in a loop (default 10,000),
//! printing the mean time of one: a steady program for `valgrind --tool=callgrind` or `perf`,
//! whose instruction counts do not move with the load of a shared machine as times do (see
//! BENCHMARKS.md). With mimalloc, as the binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use injector_core::pod::json as pod_json;
use injector_webhook::{Target, decide};

#[path = "../benches/fixture/mod.rs"]
mod fixture;
use fixture::REVIEW;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let times: usize = std::env::args()
        .nth(1)
        .map_or(10_000, |n| n.parse().expect("a number of times"));
    let snapshot = fixture::snapshot();
    let allowance = pod_json::allowance(REVIEW.len());
    let started = std::time::Instant::now();
    let mut answered = 0;
    for _ in 0..times {
        let decision = decide(
            std::hint::black_box(REVIEW),
            Target::All,
            &snapshot,
            allowance,
        )
        .unwrap();
        answered += decision.body.len();
    }
    let each = started.elapsed().as_secs_f64() / times.max(1) as f64;
    println!(
        "{times} decisions, {:.2} us each ({answered} bytes answered)",
        each * 1e6
    );
}
