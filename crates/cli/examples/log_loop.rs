#![allow(missing_docs, clippy::unwrap_used)]
use tracing_subscriber::fmt::MakeWriter;
#[derive(Clone)]
struct Sink;
struct W;
impl std::io::Write for W {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        std::hint::black_box(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
impl<'a> MakeWriter<'a> for Sink {
    type Writer = W;
    fn make_writer(&'a self) -> W {
        W
    }
}
fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(10000, |n| n.parse().unwrap());
    let filter = tracing_subscriber::EnvFilter::try_new("info").unwrap();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(Sink)
        .init();
    let uid = String::from("705ab4f5-6393-11e8-b7cc-42010a800002");
    let ns = String::from("shop");
    let pod = String::from("checkout-7c9f8d6b5-");
    let rec = String::from("log-shipper@3,mesh-proxy@7,app-telemetry@1");
    let t = std::time::Instant::now();
    for i in 0..n {
        tracing::info!(uid = %uid, namespace = %ns, pod = %pod, group = "all", outcome = "injected", templates = %rec, warnings = 0usize, duration_us = i as u64, "admission");
    }
    println!("{:.3} us", t.elapsed().as_secs_f64() * 1e6 / n as f64);
}
