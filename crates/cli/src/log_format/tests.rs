#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{Level, debug, error, info, info_span, trace, warn};
use tracing_subscriber::fmt::MakeWriter;

use super::*;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn lines(&self) -> Vec<String> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[derive(Debug)]
struct Failed(Option<Box<Failed>>);

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "outer" } else { "inner" })
    }
}

impl std::error::Error for Failed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.as_deref().map(|e| e as _)
    }
}

/// Logs a variety of events, the admission line among them.
fn log_events() {
    log_events_json_can_write();
    info!(failing = ?Failing, "a Debug that fails");
}

/// The same but for the failing `Debug`, on which tracing-subscriber's JSON format panics.
fn log_events_json_can_write() {
    info!(
        uid = "0d9e1f0a-5c1b",
        namespace = "shop",
        pod = "web-7d4b9c-",
        group = "all",
        outcome = "injected",
        templates = "log-shipper@3#00a1b2c3d4e5f607,proxy@1#ffffffff00000000",
        warnings = 0usize,
        duration_us = 42u64,
        "admission"
    );
    warn!(path = %"/mutate/x", "message with \x1b[31m an escape \u{85} and a bell \x07");
    info!(
        text = "quote \" backslash \\ newline \n tab \t é",
        n = -5i64,
        ok = true,
        f = 1.5f64,
        "plain"
    );
    debug!(r#type = "raw", list = ?vec![1, 2], "raw field names and Debug values");
    trace!(a = 1u64);
    error!("count {} of {:?}", 3, "x");
    info!(
        error = &Failed(Some(Box::new(Failed(None)))) as &dyn std::error::Error,
        "with an error"
    );
    let span = info_span!("reconcile", template = "a");
    span.in_scope(|| info!(done = true, "inside a span"));
    span.in_scope(|| info!(parent: None, root = true, "a root event inside a span"));
    info!(parent: &span, "an event given its parent");
    info!(message = 5u64);
    info!(message = true, after = -1i64);
    warn!(
        "log.target" = "not a log record",
        "log.line" = 3u64,
        "x.y" = true,
        "with log fields"
    );
}

/// A value whose `Debug` fails.
struct Failing;

impl fmt::Debug for Failing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("partial")?;
        Err(fmt::Error)
    }
}

fn lines_of(quick: bool) -> Vec<String> {
    let captured = Captured::default();
    let builder = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(Level::TRACE)
        .with_writer(captured.clone());
    if quick {
        tracing::subscriber::with_default(
            builder.event_format(TextLines::new()).finish(),
            log_events,
        );
    } else {
        tracing::subscriber::with_default(builder.finish(), log_events);
    }
    captured.lines()
}

fn json_lines_of(quick: bool) -> Vec<String> {
    let captured = Captured::default();
    let builder = tracing_subscriber::fmt()
        .with_max_level(Level::TRACE)
        .with_writer(captured.clone())
        .json()
        .flatten_event(true);
    if quick {
        tracing::subscriber::with_default(
            builder.event_format(JsonLines::new()).finish(),
            log_events_json_can_write,
        );
    } else {
        tracing::subscriber::with_default(builder.finish(), log_events_json_can_write);
    }
    captured.lines()
}

#[test]
fn json_lines_are_tracing_subscribers_but_for_the_instant() {
    let quick = json_lines_of(true);
    let json = json_lines_of(false);
    assert_eq!(quick.len(), 13, "{quick:#?}");
    assert_eq!(quick.len(), json.len());
    let prefix = r#"{"timestamp":""#.len();
    for (quick, json) in quick.iter().zip(&json) {
        // The instant: 27 characters after the prefix.
        assert_eq!(quick[..prefix], json[..prefix]);
        assert_eq!(quick[prefix + 27..], json[prefix + 27..], "{quick}\n{json}");
        let line: serde_json::Value = serde_json::from_str(quick).unwrap();
        assert!(
            line["timestamp"].as_str().unwrap().ends_with('Z'),
            "{quick}"
        );
    }
    let admission: serde_json::Value = serde_json::from_str(&quick[0]).unwrap();
    assert_eq!(admission["message"], "admission");
    assert_eq!(admission["uid"], "0d9e1f0a-5c1b");
    assert_eq!(admission["duration_us"], 42);
}

#[test]
fn lines_are_the_default_formats_but_for_the_instant() {
    let quick = lines_of(true);
    let full = lines_of(false);
    assert_eq!(quick.len(), 14, "{quick:#?}");
    assert_eq!(quick.len(), full.len());
    for (quick, full) in quick.iter().zip(&full) {
        // A `Debug` that fails: tracing-subscriber's notice, without an instant.
        if full.starts_with("Unable to format") {
            assert_eq!(quick, full);
            continue;
        }
        let (quick_time, quick_rest) = quick.split_at(27);
        let (full_time, full_rest) = full.split_at(27);
        assert!(quick_rest.starts_with(' '), "{quick}");
        assert_eq!(quick_rest, full_rest);
        for time in [quick_time, full_time] {
            assert!(time.ends_with('Z') && time.as_bytes()[10] == b'T', "{time}");
        }
    }
    assert!(
        quick[0].ends_with(
            r#" INFO injector_cli::log_format::tests: admission uid="0d9e1f0a-5c1b" namespace="shop" pod="web-7d4b9c-" group="all" outcome="injected" templates="log-shipper@3#00a1b2c3d4e5f607,proxy@1#ffffffff00000000" warnings=0 duration_us=42"#
        ),
        "{}",
        quick[0]
    );
}

#[test]
fn the_instant_is_written_in_utc_as_the_default_format_writes_it() {
    let at = |seconds: u64, micros: u64| {
        let mut line = String::new();
        write_timestamp(
            &mut line,
            UNIX_EPOCH + Duration::from_micros(seconds * 1_000_000 + micros),
        )
        .unwrap();
        line
    };
    assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
    assert_eq!(at(951_868_800, 7), "2000-03-01T00:00:00.000007Z");
    assert_eq!(at(951_868_799, 999_999), "2000-02-29T23:59:59.999999Z");
    assert_eq!(
        at(1_709_164_800 + 3_723, 120_000),
        "2024-02-29T01:02:03.120000Z"
    );
    assert_eq!(at(1_795_655_928, 123_456), "2026-11-26T01:18:48.123456Z");
    assert_eq!(at(4_102_444_799, 1), "2099-12-31T23:59:59.000001Z");
    assert_eq!(at(253_402_300_799, 0), "9999-12-31T23:59:59.000000Z");
    // Past 9999, the default format writes it.
    let mut line = String::new();
    assert!(
        write_timestamp(&mut line, UNIX_EPOCH + Duration::from_secs(253_402_300_800)).is_none()
    );
}
