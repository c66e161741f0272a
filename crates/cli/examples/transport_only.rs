//! The transport alone, for `just bench-webhook`: the admission server's HTTPS transport
//! (`injector_webhook::transport`: the same rustls configuration, HTTP/1.1 settings, limits and
//! body reading) answering every request with a fixed body, and nothing else. Built like the
//! binary (mimalloc, the same multi-threaded runtime), so that the webhook's throughput can be
//! given as a share of what the transport allows on the same machine.
//!
//! `cargo run --release -p injector-cli --example transport_only -- --tls-cert C --tls-key K
//! --listen 127.0.0.1:8443 --answer FILE [--busy-us N]`
//!
//! `--busy-us` adds N µs of CPU work to every answer (a loop timed at start): run at
//! saturation next to the webhook, it says how much work of its own a request the webhook
//! could do at a given share of the transport (docs/benchmarks-history.md, "What 0.5 takes").

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use injector_webhook::transport::{Body, read_body, serve_tls};
use injector_webhook::{CertificateStore, Limits};
use tokio_util::sync::CancellationToken;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Serves a fixed answer over the webhook's HTTPS transport.
#[derive(Parser)]
struct Args {
    /// PEM certificate chain.
    #[arg(long)]
    tls_cert: PathBuf,
    /// PEM private key.
    #[arg(long)]
    tls_key: PathBuf,
    /// The HTTPS address.
    #[arg(long)]
    listen: SocketAddr,
    /// The body of every answer (the benchmark gives the webhook's answer to its request).
    #[arg(long)]
    answer: PathBuf,
    /// CPU work added to every answer to a body read whole, in µs (0: none).
    #[arg(long, default_value_t = 0.0)]
    busy_us: f64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let busy_steps = steps_for(args.busy_us);
    let answer = Bytes::from(
        std::fs::read(&args.answer)
            .with_context(|| format!("cannot read {}", args.answer.display()))?,
    );
    let certificates = CertificateStore::new();
    certificates.set_pem(
        &std::fs::read(&args.tls_cert)?,
        &std::fs::read(&args.tls_key)?,
    )?;
    let limits = Limits::default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = injector_webhook::server::bind(args.listen).await?;
        let stop = CancellationToken::new();
        let on_signal = stop.clone();
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::spawn(async move {
            terminate.recv().await;
            on_signal.cancel();
        });
        let max_body_bytes = limits.max_body_bytes;
        let handler =
            move |request| answer_with(request, answer.clone(), max_body_bytes, busy_steps);
        serve_tls(listener, certificates, &limits, handler, || {}, stop).await?;
        Ok(())
    })
}

/// Reads the body as the webhook does (one buffer of the declared size, within the limit) and
/// answers `answer`.
async fn answer_with(
    request: Request<Incoming>,
    answer: Bytes,
    max_body_bytes: usize,
    busy_steps: u64,
) -> Result<Response<Body>, Infallible> {
    let expected = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(max_body_bytes)
        .min(max_body_bytes);
    let mut response = match read_body(Limited::new(request.into_body(), expected), expected).await
    {
        Ok(_) => {
            busy(busy_steps);
            Response::new(Full::new(answer))
        }
        Err(_) => {
            let mut response = Response::new(Full::default());
            *response.status_mut() = StatusCode::BAD_REQUEST;
            response
        }
    };
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

/// `steps` of a chain of dependent multiply-adds, each through a stack slot (`black_box`), so
/// that the compiler keeps them.
fn busy(steps: u64) {
    let mut value = steps;
    for step in 0..steps {
        value = std::hint::black_box(value.wrapping_mul(31).wrapping_add(step));
    }
    std::hint::black_box(value);
}

/// How many steps of [`busy`] take `micros` µs on this machine: the quickest of a few timings
/// at start, after one to warm up.
fn steps_for(micros: f64) -> u64 {
    if micros <= 0.0 {
        return 0;
    }
    const SAMPLE: u64 = 1_000_000;
    busy(SAMPLE);
    let nanos_per_step = (0..5)
        .map(|_| {
            let started = std::time::Instant::now();
            busy(SAMPLE);
            started.elapsed().as_nanos() as f64 / SAMPLE as f64
        })
        .fold(f64::INFINITY, f64::min)
        .max(0.01);
    let steps = (micros * 1000.0 / nanos_per_step) as u64;
    eprintln!("busy: {micros} µs a request, {steps} steps of {nanos_per_step:.2} ns");
    steps
}
