//! The logging flags (Go's component-base logging flags), mapped onto `tracing`.

use std::time::Duration;

use clap::{ArgAction, Args, ValueEnum};

use crate::machinery::go_syntax::parse_go_duration;

/// `--logging-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// klog's text header, as Go's structured text logging writes it (the default):
    /// `I1127 20:35:19.717632       1 sync.rs:312] "node synced" node="worker-1"`.
    #[default]
    Text,
    /// One JSON object per line with component-base's keys (`ts`, `caller`, `msg`, `v`,
    /// `err`), as Go's `--logging-format=json`.
    Json,
}

/// Logging flags: Go's component-base logging flags (`k8s.io/component-base/logs/api/v1`),
/// mapped onto `tracing`.
#[derive(Args, Clone, Debug, Default)]
#[command(next_help_heading = "Logging")]
pub struct LoggingArgs {
    /// Log verbosity as in klog: 0-2 info, 3-4 debug, 5+ trace. `RUST_LOG`, when set, wins.
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub verbosity: u8,
    /// Log format: `text` or `json` (Go's `--logging-format`; `--log-format` is accepted too).
    #[arg(long = "logging-format", visible_alias = "log-format", value_enum, default_value_t = LogFormat::Text, value_name = "FORMAT")]
    pub log_format: LogFormat,
    /// Per-module verbosity, `pattern=N` comma-separated (Go: per source file). Here a pattern
    /// is a Rust module path (a `tracing` target, e.g. `ccm_controllers::controllers::node_ipam=4`); a
    /// trailing `*` is dropped. Text format only, as in Go.
    #[arg(long, value_delimiter = ',', value_name = "PATTERN=N")]
    pub vmodule: Vec<String>,
    /// Accepted for Go compatibility (default 5s); logs are written unbuffered, so there is
    /// nothing to flush.
    #[arg(long, value_parser = parse_go_duration, value_name = "DURATION")]
    pub log_flush_frequency: Option<Duration>,
    /// JSON format: errors to stderr, everything else to stdout (Go's alpha option; needs
    /// `--feature-gates=LoggingAlphaOptions=true` as in Go).
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub log_json_split_stream: bool,
    /// JSON format with split streams: Go buffers info messages up to this size. Accepted (a
    /// quantity such as `512`, `1K`, `2Ki`); logs here are never buffered.
    #[arg(long, value_parser = parse_quantity, value_name = "QUANTITY")]
    pub log_json_info_buffer_size: Option<String>,
    /// Text format: errors to stderr, everything else to stdout (Go's alpha option; needs
    /// `--feature-gates=LoggingAlphaOptions=true` as in Go).
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub log_text_split_stream: bool,
    /// Text format with split streams: Go buffers info messages up to this size. Accepted;
    /// logs here are never buffered.
    #[arg(long, value_parser = parse_quantity, value_name = "QUANTITY")]
    pub log_text_info_buffer_size: Option<String>,
}

/// A Kubernetes quantity as the logging buffer sizes take it (`512`, `1K`, `2Ki`, `3M`, `5Mi`).
fn parse_quantity(input: &str) -> Result<String, String> {
    let s = input.trim();
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &s[digits.len()..];
    let number_ok = !digits.is_empty() && digits.parse::<f64>().is_ok_and(|n| n >= 0.0);
    let suffix_ok = matches!(
        suffix,
        "" | "k" | "K" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
    );
    if number_ok && suffix_ok {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{input:?} is not a quantity; use bytes (512), multiples of 1000 (1K) or of 1024 (2Ki)"
        ))
    }
}

/// Whether a quantity accepted by `parse_quantity` is more than zero.
pub(super) fn quantity_is_nonzero(q: &str) -> bool {
    q.trim_end_matches(|c: char| c.is_ascii_alphabetic())
        .parse::<f64>()
        .is_ok_and(|n| n > 0.0)
}

impl LoggingArgs {
    /// `--vmodule` as `tracing` filter directives (`target=level`), and the patterns that have
    /// no such form (reported as warnings).
    pub fn vmodule_directives(&self) -> (Vec<String>, Vec<String>) {
        let mut directives = Vec::new();
        let mut unmapped = Vec::new();
        for item in self
            .vmodule
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
        {
            let Some((pattern, level)) = item.split_once('=') else {
                unmapped.push(item.to_owned());
                continue;
            };
            let target = pattern.trim().trim_end_matches('*');
            let valid = !target.is_empty()
                && target.split("::").all(|p| {
                    !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
            match (valid, level.trim().parse::<u8>()) {
                (true, Ok(n)) => directives.push(format!("{target}={}", verbosity_level(n))),
                _ => unmapped.push(item.to_owned()),
            }
        }
        (directives, unmapped)
    }

    /// The `tracing` level of `-v`.
    pub fn level(&self) -> &'static str {
        verbosity_level(self.verbosity)
    }

    /// Whether errors go to stderr and the rest to stdout.
    pub fn split_stream(&self) -> bool {
        match self.log_format {
            LogFormat::Text => self.log_text_split_stream,
            LogFormat::Json => self.log_json_split_stream,
        }
    }
}

/// klog verbosity to a `tracing` level: 0-2 info, 3-4 debug, 5+ trace.
fn verbosity_level(v: u8) -> &'static str {
    match v {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    }
}
