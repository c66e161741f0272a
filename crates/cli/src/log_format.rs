//! Log lines, text or JSON, written as `tracing_subscriber`'s formats write them (text without
//! colours; JSON with the event's fields flattened), by a quicker path for the events logged
//! most (the webhook logs one per admission).
//!
//! Those formats spent about 13,000 instructions on a line: styles painted even with colours
//! off, `fmt` padding for the level and each part of the timestamp, JSON written through a
//! `fmt::Write` adaptor. Events with spans, `log` records or (text) errors or colours take
//! the format they did, and so does an event whose timestamp falls outside the years 1970 to
//! 9999; the tests compare the two on the rest.

use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Full, Json, Writer};
use tracing_subscriber::fmt::time::SystemTime as DefaultTime;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The text format of `--log-format text`.
pub struct TextLines {
    full: Format<Full, DefaultTime>,
}

impl TextLines {
    /// The text format, with the default format for the events the quick path leaves.
    pub fn new() -> Self {
        TextLines {
            full: tracing_subscriber::fmt::format(),
        }
    }
}

impl Default for TextLines {
    fn default() -> Self {
        TextLines::new()
    }
}

impl<S, N> FormatEvent<S, N> for TextLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        // `log` records carry their own target and location in fields the default format reads.
        if !writer.has_ansi_escapes()
            && meta.target() != "log"
            && ctx.event_scope().is_none()
            && let Some(line) = quick_line(SystemTime::now(), event)
        {
            return writer.write_str(&line);
        }
        self.full.format_event(ctx, writer, event)
    }
}

/// The JSON format of `--log-format json` (fields flattened into the line's object).
pub struct JsonLines {
    json: Format<Json, DefaultTime>,
}

impl JsonLines {
    /// The JSON format, with `tracing_subscriber`'s for the events the quick path leaves.
    pub fn new() -> Self {
        JsonLines {
            json: tracing_subscriber::fmt::format().json().flatten_event(true),
        }
    }
}

impl Default for JsonLines {
    fn default() -> Self {
        JsonLines::new()
    }
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // The spans tracing-subscriber's JSON format writes: the event's parent, else the
        // current span (also for an event given no parent).
        if event.metadata().target() != "log"
            && event.parent().is_none()
            && ctx.lookup_current().is_none()
            && let Some(line) = quick_json_line(SystemTime::now(), event)
        {
            return writer.write_str(&line);
        }
        self.json.format_event(ctx, writer, event)
    }
}

/// The JSON line of `event` at `now`: `{"timestamp":…,"level":…,<fields>,"target":…}`, as
/// `serde_json` writes each part; `None` where it is left to `tracing_subscriber`.
fn quick_json_line(now: SystemTime, event: &Event<'_>) -> Option<String> {
    let meta = event.metadata();
    let mut timestamp = String::with_capacity(32);
    write_timestamp(&mut timestamp, now)?;
    let mut fields = JsonFields {
        line: Vec::with_capacity(320),
    };
    fields.line.push(b'{');
    fields.entry("timestamp", &timestamp);
    fields.entry("level", meta.level().as_str());
    event.record(&mut fields);
    fields.entry("target", meta.target());
    fields.line.extend_from_slice(b"}\n");
    String::from_utf8(fields.line).ok()
}

/// An event's fields as entries of a JSON object, as `tracing_serde`'s map visitor writes
/// them.
struct JsonFields {
    line: Vec<u8>,
}

impl JsonFields {
    fn entry<V: serde::Serialize + ?Sized>(&mut self, name: &str, value: &V) {
        if self.line.len() > 1 {
            self.line.push(b',');
        }
        // Strings, numbers and booleans written into a `Vec` do not fail (a float that is not
        // a number is written `null`).
        let _ = serde_json::to_writer(&mut self.line, name);
        self.line.push(b':');
        let _ = serde_json::to_writer(&mut self.line, value);
    }
}

impl Visit for JsonFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.entry(field.name(), value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.entry(field.name(), &value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.entry(field.name(), &value);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.entry(field.name(), &value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.entry(field.name(), &value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // Formatted first: `serde_json` panics on a `Debug` that fails (tracing-subscriber's
        // own JSON format does), where this writes what it wrote before failing.
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        self.entry(field.name(), text.as_str());
    }
}

/// The text line of `event` at `now`; `None` where it is left to the default format.
fn quick_line(now: SystemTime, event: &Event<'_>) -> Option<String> {
    let mut line = String::with_capacity(256);
    write_timestamp(&mut line, now)?;
    let meta = event.metadata();
    // The level right-aligned in five characters.
    let level = meta.level().as_str();
    line.push_str(if level.len() < 5 { "  " } else { " " });
    line.push_str(level);
    line.push(' ');
    line.push_str(meta.target());
    line.push_str(": ");
    let mut fields = Fields {
        line,
        first: true,
        unsupported: false,
    };
    event.record(&mut fields);
    if fields.unsupported {
        return None;
    }
    fields.line.push('\n');
    Some(fields.line)
}

/// `YYYY-MM-DDTHH:MM:SS.uuuuuuZ` in UTC, as the default formats write it.
fn write_timestamp(line: &mut String, now: SystemTime) -> Option<()> {
    let since = now.duration_since(UNIX_EPOCH).ok()?;
    let seconds = since.as_secs();
    let (year, month, day) = civil_from_days(seconds / 86_400);
    if year > 9999 {
        return None;
    }
    let in_day = seconds % 86_400;
    push_digits(line, year, 4);
    line.push('-');
    push_digits(line, month, 2);
    line.push('-');
    push_digits(line, day, 2);
    line.push('T');
    push_digits(line, in_day / 3600, 2);
    line.push(':');
    push_digits(line, in_day / 60 % 60, 2);
    line.push(':');
    push_digits(line, in_day % 60, 2);
    line.push('.');
    push_digits(line, u64::from(since.subsec_micros()), 6);
    line.push('Z');
    Some(())
}

/// The date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`, for days from the
/// epoch on).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Counted from 0000-03-01, so that a leap day ends its year.
    let days = days + 719_468;
    let era = days / 146_097;
    let of_era = days % 146_097;
    let year_of_era = (of_era - of_era / 1460 + of_era / 36_524 - of_era / 146_096) / 365;
    let day_of_year = of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// `value`'s last `width` decimal digits, zero-padded.
fn push_digits(line: &mut String, value: u64, width: u32) {
    let mut divisor = 10u64.pow(width.saturating_sub(1));
    while divisor > 0 {
        let digit = (value / divisor % 10) as u8;
        line.push(char::from(b'0' + digit));
        divisor /= 10;
    }
}

/// The event's fields, written as the default format's visitor writes them without colours.
struct Fields {
    line: String,
    first: bool,
    /// A field the default format writes its own way: an error and its sources, or a `Debug`
    /// that fails.
    unsupported: bool,
}

impl Fields {
    fn separate(&mut self) {
        if self.first {
            self.first = false;
        } else {
            self.line.push(' ');
        }
    }

    /// A number or boolean: `name=value`, but for the message and `log.*` fields, which
    /// take the `Debug` path as in the default format.
    fn scalar<V: fmt::Display + fmt::Debug>(&mut self, field: &Field, value: V) {
        if is_plain(field) {
            self.separate();
            self.name(field);
            // Writing to a `String` does not fail.
            let _ = write!(self.line, "{value}");
        } else {
            self.record_debug(field, &value);
        }
    }

    fn name(&mut self, field: &Field) {
        let name = field.name();
        self.line.push_str(name.strip_prefix("r#").unwrap_or(name));
        self.line.push('=');
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.separate();
            push_sanitized(&mut self.line, value);
        } else if !is_log_metadata(field) {
            self.separate();
            self.name(field);
            push_quoted(&mut self.line, value);
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.scalar(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.scalar(field, value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.scalar(field, value);
    }

    fn record_error(&mut self, _: &Field, _: &(dyn std::error::Error + 'static)) {
        self.unsupported = true;
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if is_log_metadata(field) {
            return;
        }
        self.separate();
        // A `Debug` that fails leaves the line to tracing-subscriber, which says so.
        let written = if field.name() == "message" {
            // A message is a `format_args!`, whose `Debug` is its text.
            let mut text = String::new();
            let written = write!(text, "{value:?}");
            push_sanitized(&mut self.line, &text);
            written
        } else {
            self.name(field);
            write!(self.line, "{value:?}")
        };
        self.unsupported |= written.is_err();
    }
}

/// Neither the message nor a field the text format leaves out: written as `name=value`.
fn is_plain(field: &Field) -> bool {
    field.name() != "message" && !is_log_metadata(field)
}

/// What a `log` record carries besides its message (its target, file, line), which the text
/// format leaves out.
fn is_log_metadata(field: &Field) -> bool {
    field.name().starts_with("log.")
}

/// `value` as `{:?}` writes a `str`: quoted, with escapes.
fn push_quoted(line: &mut String, value: &str) {
    if value
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        line.push('"');
        line.push_str(value);
        line.push('"');
    } else {
        let _ = write!(line, "{value:?}");
    }
}

/// A message with the characters a terminal acts on escaped, as the default format escapes
/// them (so that a logged text cannot restyle or rewrite the terminal showing it).
fn push_sanitized(line: &mut String, value: &str) {
    for ch in value.chars() {
        match ch {
            '\x1b' => line.push_str("\\x1b"),
            '\x07' => line.push_str("\\x07"),
            '\x08' => line.push_str("\\x08"),
            '\x0c' => line.push_str("\\x0c"),
            '\x7f' => line.push_str("\\x7f"),
            '\u{80}'..='\u{9f}' => {
                let _ = write!(line, "\\u{{{:x}}}", u32::from(ch));
            }
            _ => line.push(ch),
        }
    }
}

#[cfg(test)]
#[path = "log_format/tests.rs"]
mod tests;
