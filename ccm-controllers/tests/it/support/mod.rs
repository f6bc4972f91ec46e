//! Helpers the test modules share. `https.rs`, `connection.rs`, `openmetrics.rs` and
//! `minimal_api.rs` are also compiled into the test binaries that run apart
//! (`tests/runtime_logs.rs`, `tests/runtime_signal.rs`), so each of those files holds only
//! what every binary that includes it uses.

pub(crate) mod connection;
pub(crate) mod https;
pub(crate) mod minimal_api;
pub(crate) mod node;
pub(crate) mod openmetrics;
pub(crate) mod requests;
pub(crate) mod service;

/// Asserts that `log` has exactly one WARN line for the Warning Event `reason` on `object`
/// (`<namespace>/<name>`, or a Node's name), carrying the Event's note (which names the
/// error), of which `note` is the start: every Warning a controller records is logged too,
/// once per object and reason within the rate-limit interval.
#[track_caller]
pub(crate) fn assert_warning_logged(
    log: &ccm_testing::logging::RecordedLog,
    reason: &str,
    object: &str,
    note: &str,
) {
    let lines: Vec<String> = log
        .lines_containing(&format!("reason=\"{reason}\""))
        .into_iter()
        .filter(|l| {
            l.contains(&format!("object={object} ")) || l.ends_with(&format!("object={object}"))
        })
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one WARN line for {reason} on {object}:\n{}",
        log.text()
    );
    assert!(
        lines[0].contains(" WARN ") && lines[0].contains(&format!("{reason}: {note}")),
        "{}",
        lines[0]
    );
}
