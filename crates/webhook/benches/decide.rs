//! Benchmark of what the webhook does per admission request besides the transport: `decide` on
//! the typical AdmissionReview of `just bench-webhook` (an 8 KB Deployment Pod, 8,950 bytes of
//! review) with its three templates, answered from `/mutate`: reading the review, decoding the
//! Pod within its allowance, selecting and planning, and encoding the answer with its patch.
//!
//! With mimalloc, as the binary. Run with `cargo bench -p injector-webhook --bench decide`;
//! see BENCHMARKS.md.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use injector_core::pod::json as pod_json;
use injector_webhook::{Outcome, Target, decide};

mod fixture;
use fixture::REVIEW;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn bench_decide(c: &mut Criterion) {
    let snapshot = fixture::snapshot();
    let allowance = pod_json::allowance(REVIEW.len());
    let decision = decide(REVIEW, Target::All, &snapshot, allowance).unwrap();
    assert_eq!(decision.outcome, Outcome::Injected);
    assert_eq!(decision.applied.len(), 3);

    c.bench_function("decide/typical_review", |b| {
        b.iter(|| decide(black_box(REVIEW), Target::All, &snapshot, allowance).unwrap())
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(3));
    targets = bench_decide
}
criterion_main!(benches);
