//! Go's two log formats for `tracing` events, so that a log pipeline written for a Go
//! cloud-controller-manager reads ours: klog's text header (`--logging-format=text`) and
//! component-base's JSON (`--logging-format=json`, zap through zapr).
//!
//! Written by hand: no crate writes klog's header or component-base's JSON keys. The choices
//! where Rust and Go differ (docs/operating.md, "Logs"):
//!
//! - Severity: `ERROR` is `E`, `WARN` is `W`; `INFO`, `DEBUG` and `TRACE` are `I`, as klog logs
//!   its `V(n).Info` lines. In JSON, `DEBUG` is `"v":3` and `TRACE` `"v":5` (the `-v` that shows
//!   them), `INFO` and `WARN` are `"v":0` (Go's JSON logs klog's warnings as `Info` too), `ERROR`
//!   has no `v`, as zapr's `Error`.
//! - Time: local time, as klog (a container without a time zone is UTC).
//! - The thread-id field: the process id, as klog prints (`os.Getpid()`).
//! - Caller: the basename of the Rust source file in text (klog), the last directory and the
//!   file in JSON (zap's short caller); `???:1` when unknown, as klog.
//! - The field `error` is written as `err`, Go's key for errors.
//! - Values: integers, floats and booleans bare; everything else (strings, `%display` and
//!   `?debug` values) a string, quoted as Go's `strconv.Quote` in text (a value with a line
//!   break in klog's `key=<` block) and as a JSON string in JSON. No colour, ever: control
//!   characters in a message or a value are escaped, so no escape character reaches the log.

use std::fmt::{self, Write as _};

use jiff::Timestamp;
use jiff::tz::TimeZone;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// A field's value, as Go's structured loggers tell them apart: numbers and booleans are
/// written bare, everything else as a string.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    /// A string (also any `%display` or `?debug` value).
    Str(String),
    /// An integer, written as its digits.
    Int(String),
    /// A float.
    Float(f64),
    /// A boolean.
    Bool(bool),
}

/// One log event, taken apart: what both formats write.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Entry {
    /// The event's level.
    pub(crate) level: Level,
    /// The source file's path as `tracing` has it (`file!()`), if known.
    pub(crate) file: Option<String>,
    /// The source line, if known.
    pub(crate) line: Option<u32>,
    /// The message (`""` for an event without one).
    pub(crate) message: String,
    /// The error (the field `error` or `err`), if any.
    pub(crate) err: Option<Value>,
    /// The other fields, in the order they were recorded.
    pub(crate) fields: Vec<(String, Value)>,
}

/// The `tracing_subscriber::fmt` event formatter writing Go's text or JSON format.
pub(crate) struct GoFormat {
    /// JSON (component-base's keys) rather than klog's text header.
    pub(crate) json: bool,
    /// The local time zone, read once at start-up as Go reads `time.Local`.
    pub(crate) tz: TimeZone,
    /// The process id, klog's thread-id field.
    pub(crate) pid: u32,
}

impl GoFormat {
    /// The format for this process: local time zone, its process id.
    pub(crate) fn new(json: bool) -> GoFormat {
        GoFormat {
            json,
            tz: TimeZone::system(),
            pid: std::process::id(),
        }
    }
}

impl<S, N> FormatEvent<S, N> for GoFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let now = Timestamp::now();
        // Records bridged from the `log` crate carry their file and line in fields.
        let normalized = event.normalized_metadata();
        let metadata = normalized.as_ref().unwrap_or_else(|| event.metadata());
        let mut entry = Entry {
            level: *metadata.level(),
            file: metadata.file().map(str::to_owned),
            line: metadata.line(),
            message: String::new(),
            err: None,
            fields: Vec::new(),
        };
        event.record(&mut entry);
        let line = if self.json {
            json_line(&entry, now)
        } else {
            klog_line(&entry, &now.to_zoned(self.tz.clone()), self.pid)
        };
        writer.write_str(&line)
    }
}

impl Entry {
    fn push(&mut self, field: &Field, value: Value) {
        match field.name() {
            "error" | "err" => self.err = Some(value),
            // The `log` bridge's metadata fields: already in the header.
            name if name.starts_with("log.") => {}
            name => self.fields.push((name.to_owned(), value)),
        }
    }
}

impl Visit for Entry {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.push(field, Value::Str(format!("{value:?}")));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.push(field, Value::Str(value.to_owned()));
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, Value::Int(value.to_string()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, Value::Int(value.to_string()));
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        self.push(field, Value::Int(value.to_string()));
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        self.push(field, Value::Int(value.to_string()));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push(field, Value::Float(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, Value::Bool(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.push(field, Value::Str(value.to_string()));
    }
}

/// klog's severity letter.
fn severity(level: Level) -> char {
    match level {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    }
}

/// The klog verbosity of a level for the JSON `v` key (`None` for errors, which have none).
fn verbosity(level: Level) -> Option<u8> {
    match level {
        Level::ERROR => None,
        Level::DEBUG => Some(3),
        Level::TRACE => Some(5),
        _ => Some(0),
    }
}

/// One line in klog's text format, as Go's structured text logging writes it:
/// `I1127 20:35:19.717632       1 sync.rs:169] "Message" err="..." key="value"`.
pub(crate) fn klog_line(entry: &Entry, now: &jiff::Zoned, pid: u32) -> String {
    let mut out = String::with_capacity(128);
    let file = entry
        .file
        .as_deref()
        .map(|f| f.rsplit(['/', '\\']).next().unwrap_or(f));
    let (file, line) = match (file, entry.line) {
        (Some(file), Some(line)) => (file, line),
        _ => ("???", 1),
    };
    let _ = write!(
        out,
        "{}{:02}{:02} {:02}:{:02}:{:02}.{:06} {pid:>7} {file}:{line}] ",
        severity(entry.level),
        now.month(),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        now.subsec_nanosecond() / 1000,
    );
    go_quote(&mut out, &entry.message);
    let err = entry.err.as_ref().map(|e| ("err", e));
    let fields = entry.fields.iter().map(|(k, v)| (k.as_str(), v));
    for (key, value) in err.into_iter().chain(fields) {
        out.push(' ');
        out.push_str(key);
        match value {
            Value::Str(s) if s.contains('\n') => multi_line(&mut out, s),
            Value::Str(s) => {
                out.push('=');
                go_quote(&mut out, s);
            }
            Value::Int(n) => {
                let _ = write!(out, "={n}");
            }
            Value::Float(f) if f.is_finite() => {
                let _ = write!(out, "={f}");
            }
            Value::Float(f) => {
                out.push('=');
                go_quote(&mut out, &f.to_string());
            }
            Value::Bool(b) => {
                let _ = write!(out, "={b}");
            }
        }
    }
    out.push('\n');
    out
}

/// klog's form of a string value with line breaks: `key=<`, each line indented by a tab,
/// then ` >`; the data as it is, unquoted (klog's `writeStringValue`), but with control
/// characters other than tab and line break escaped, so no escape character is written.
fn multi_line(out: &mut String, value: &str) {
    out.push_str("=<\n");
    for line in value.split_inclusive('\n') {
        out.push('\t');
        for c in line.chars() {
            if c.is_control() && c != '\n' && c != '\t' {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            } else {
                out.push(c);
            }
        }
    }
    if !value.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(" >");
}

/// Go's `strconv.Quote`: double quotes; `"` and `\` escaped; `\a \b \f \n \r \t \v`; other
/// ASCII control characters as `\xNN`; other non-printable characters as `\uNNNN`. (Go's
/// `unicode.IsPrint` is approximated: control and whitespace characters other than the space
/// are escaped, all others kept.)
pub(crate) fn go_quote(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if c.is_control() || (c.is_whitespace() && c != ' ') => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// One line in component-base's JSON format (zap through zapr):
/// `{"ts":1764275719717.632,"caller":"cloud_node/sync.rs:169","msg":"...","v":0,"key":"value"}`,
/// `ts` in milliseconds since the epoch, `err` last on errors as zapr writes it.
pub(crate) fn json_line(entry: &Entry, now: Timestamp) -> String {
    let mut out = String::with_capacity(160);
    // Go: float64(UnixNano) / float64(time.Millisecond), written in the shortest form.
    let millis = now.as_nanosecond() as f64 / 1e6;
    let _ = write!(out, "{{\"ts\":{millis},\"caller\":");
    let caller = match (entry.file.as_deref(), entry.line) {
        (Some(file), Some(line)) => {
            // zap's ShortCallerEncoder: the last directory and the file.
            let mut parts = file.rsplitn(3, ['/', '\\']);
            let name = parts.next().unwrap_or(file);
            match parts.next() {
                Some(dir) => format!("{dir}/{name}:{line}"),
                None => format!("{name}:{line}"),
            }
        }
        _ => "???:1".to_owned(),
    };
    json_string(&mut out, &caller);
    out.push_str(",\"msg\":");
    json_string(&mut out, &entry.message);
    if let Some(v) = verbosity(entry.level) {
        let _ = write!(out, ",\"v\":{v}");
    }
    let fields = entry.fields.iter().map(|(k, v)| (k.as_str(), v));
    let err = entry.err.as_ref().map(|e| ("err", e));
    for (key, value) in fields.chain(err) {
        out.push(',');
        json_string(&mut out, key);
        out.push(':');
        match value {
            Value::Str(s) => json_string(&mut out, s),
            Value::Int(n) => out.push_str(n),
            Value::Float(f) if f.is_finite() => {
                let _ = write!(out, "{f}");
            }
            // zap writes NaN and the infinities as strings.
            Value::Float(f) => json_string(&mut out, &go_float_name(*f)),
            Value::Bool(b) => {
                let _ = write!(out, "{b}");
            }
        }
    }
    out.push_str("}\n");
    out
}

/// Go's names of the floats JSON has no number for.
fn go_float_name(f: f64) -> String {
    match f {
        f if f.is_nan() => "NaN".to_owned(),
        f if f > 0.0 => "+Inf".to_owned(),
        _ => "-Inf".to_owned(),
    }
}

/// A JSON string (control characters as `\u00NN`, so no escape character is written).
fn json_string(out: &mut String, s: &str) {
    match serde_json::to_string(s) {
        Ok(quoted) => out.push_str(&quoted),
        // Serialising a &str cannot fail; keep the line valid JSON all the same.
        Err(_) => out.push_str("\"\""),
    }
}

#[cfg(test)]
mod tests;
