#![allow(clippy::unwrap_used)]

use super::*;

fn entry(level: Level) -> Entry {
    Entry {
        level,
        file: Some("ccm-controllers/src/controllers/cloud_node/sync.rs".to_owned()),
        line: Some(169),
        message: "failed to sync node".to_owned(),
        err: None,
        fields: vec![
            ("node".to_owned(), Value::Str("worker-1".to_owned())),
            ("attempt".to_owned(), Value::Int("3".to_owned())),
            ("ratio".to_owned(), Value::Float(0.5)),
            ("add".to_owned(), Value::Bool(true)),
        ],
    }
}

/// 2026-11-27 20:35:19.717632 UTC.
fn at() -> Timestamp {
    Timestamp::new(1_795_811_719, 717_632_500).unwrap()
}

#[test]
fn klog_header_then_the_quoted_message_then_err_first_and_bare_numbers() {
    let mut e = entry(Level::WARN);
    e.err = Some(Value::Str("fake cloud: \"boom\"".to_owned()));
    let line = klog_line(&e, &at().to_zoned(TimeZone::UTC), 1);
    assert_eq!(
        line,
        "W1127 20:35:19.717632       1 sync.rs:169] \"failed to sync node\" \
         err=\"fake cloud: \\\"boom\\\"\" node=\"worker-1\" attempt=3 ratio=0.5 add=true\n"
    );
}

#[test]
fn severity_letters_and_the_pid_right_aligned() {
    let zoned = at().to_zoned(TimeZone::UTC);
    for (level, letter) in [
        (Level::ERROR, 'E'),
        (Level::WARN, 'W'),
        (Level::INFO, 'I'),
        (Level::DEBUG, 'I'),
        (Level::TRACE, 'I'),
    ] {
        let line = klog_line(&entry(level), &zoned, 4_194_304);
        assert!(line.starts_with(&format!(
            "{letter}1127 20:35:19.717632 4194304 sync.rs:169] "
        )));
    }
    let line = klog_line(&entry(Level::INFO), &zoned, 42);
    assert!(
        line.starts_with("I1127 20:35:19.717632      42 sync.rs:169] "),
        "{line}"
    );
}

#[test]
fn local_time_is_the_zone_given() {
    let tz = TimeZone::fixed(jiff::tz::offset(2));
    let line = klog_line(&entry(Level::INFO), &at().to_zoned(tz), 1);
    assert!(line.starts_with("I1127 22:35:19.717632"), "{line}");
}

#[test]
fn unknown_caller_is_klogs() {
    let mut e = entry(Level::INFO);
    e.file = None;
    let line = klog_line(&e, &at().to_zoned(TimeZone::UTC), 1);
    assert!(line.contains(" ???:1] "), "{line}");
    assert!(json_line(&e, at()).contains("\"caller\":\"???:1\""));
}

#[test]
fn go_quoting_escapes_control_characters() {
    let mut out = String::new();
    go_quote(&mut out, "a\u{1b}[31mred\t\\ \u{7f} \u{85} é");
    assert_eq!(out, "\"a\\x1b[31mred\\t\\\\ \\x7f \\u0085 é\"");
}

#[test]
fn a_value_with_line_breaks_is_a_klog_block() {
    let mut e = entry(Level::INFO);
    e.fields = vec![(
        "config".to_owned(),
        Value::Str("a: 1\nb: \u{1b}2".to_owned()),
    )];
    let line = klog_line(&e, &at().to_zoned(TimeZone::UTC), 1);
    assert!(
        line.ends_with("\"failed to sync node\" config=<\n\ta: 1\n\tb: \\x1b2\n >\n"),
        "{line:?}"
    );
    assert!(!line.contains('\u{1b}'));
}

#[test]
fn json_has_gos_keys_and_shapes() {
    let line = json_line(&entry(Level::INFO), at());
    let (ts, rest) = line
        .strip_prefix("{\"ts\":")
        .and_then(|l| l.split_once(','))
        .unwrap();
    let ts: f64 = ts.parse().unwrap();
    assert!(
        (ts - 1_795_811_719_717.632_5).abs() < 0.001,
        "milliseconds: {ts}"
    );
    assert_eq!(
        rest,
        "\"caller\":\"cloud_node/sync.rs:169\",\"msg\":\"failed to sync node\",\
         \"v\":0,\"node\":\"worker-1\",\"attempt\":3,\"ratio\":0.5,\"add\":true}\n"
    );
    let value: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert!(value.get("level").is_none(), "Go's JSON has no level key");

    let mut error = entry(Level::ERROR);
    error.err = Some(Value::Str("boom\u{1b}".to_owned()));
    error
        .fields
        .push(("nan".to_owned(), Value::Float(f64::NAN)));
    let line = json_line(&error, at());
    assert!(!line.contains('\u{1b}'));
    let value: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert!(
        value.get("v").is_none(),
        "an error has no v, as zapr's Error"
    );
    assert_eq!(value["err"], "boom\u{1b}");
    assert_eq!(value["nan"], "NaN");
    assert!(line.ends_with(",\"err\":\"boom\\u001b\"}\n"), "{line}");

    for (level, v) in [(Level::WARN, 0), (Level::DEBUG, 3), (Level::TRACE, 5)] {
        let value: serde_json::Value =
            serde_json::from_str(&json_line(&entry(level), at())).unwrap();
        assert_eq!(value["v"], v, "{level}");
    }
}

#[test]
fn events_are_taken_apart_by_field_type() {
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::registry().with(
        tracing_subscriber::fmt::layer()
            .event_format(GoFormat::new(false))
            .with_writer(move || writer.clone()),
    );
    let mut logged_at = 0;
    tracing::subscriber::with_default(subscriber, || {
        let error = std::io::Error::other("disk \"full\"");
        let name = "n-1";
        logged_at = line!() + 1;
        tracing::error!(node = %name, count = 2u64, ok = false, error = %error, "Failed to {}", "sync");
    });
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let (header, rest) = text.split_once("] ").unwrap();
    assert!(header.starts_with('E'), "{text}");
    assert!(
        header.ends_with(&format!(" tests.rs:{logged_at}")),
        "{text}"
    );
    assert_eq!(
        rest,
        "\"Failed to sync\" err=\"disk \\\"full\\\"\" node=\"n-1\" count=2 ok=false\n"
    );
}
