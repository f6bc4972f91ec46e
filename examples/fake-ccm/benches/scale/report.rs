//! The figures: the printed table (and JSON line), and the figures every scenario shares (API
//! requests, Events).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ccm_testing::apiserver::RequestRecord;
use serde_json::{Value, json};

use crate::ccm::{Metrics, ProcStats, diff};
use crate::cli::{Opts, Scenario};
use crate::environment::{Env, LastEvent, secs};

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub(crate) struct Row {
    pub(crate) figure: String,
    pub(crate) value: String,
    pub(crate) target: String,
    pub(crate) verdict: String,
}

pub(crate) struct Report {
    pub(crate) scenario: Scenario,
    pub(crate) opts: Value,
    pub(crate) rows: Vec<Row>,
    pub(crate) figures: serde_json::Map<String, Value>,
    pub(crate) targets: serde_json::Map<String, Value>,
    pub(crate) notes: Vec<String>,
}

impl Report {
    pub(crate) fn new(opts: &Opts) -> Report {
        Report {
            scenario: opts.scenario,
            opts: opts.json(),
            rows: Vec::new(),
            figures: serde_json::Map::new(),
            targets: serde_json::Map::new(),
            notes: Vec::new(),
        }
    }

    pub(crate) fn fig(&mut self, key: &str, label: &str, value: Value, shown: String) {
        self.figures.insert(key.to_string(), value);
        self.rows.push(Row {
            figure: label.to_string(),
            value: shown,
            target: String::new(),
            verdict: String::new(),
        });
    }

    /// A memory figure given in KiB (as /proc reports it), shown in MB.
    pub(crate) fn mb(&mut self, key: &str, label: &str, kb: u64) {
        let mb = kb as f64 / 1024.0;
        self.fig(key, label, json!(mb), format!("{mb:.1} MB"));
    }

    pub(crate) fn secs(&mut self, key: &str, label: &str, d: Duration) {
        self.fig(
            key,
            label,
            json!(secs(d)),
            format!("{:.3} s", d.as_secs_f64()),
        );
    }

    /// A figure with a target; `applies` is false when the run's size differs from the size
    /// the target is stated for (then it is shown, not judged).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn target(
        &mut self,
        key: &str,
        label: &str,
        value: f64,
        shown: String,
        target: &str,
        ok: bool,
        miss: String,
        applies: bool,
    ) {
        self.figures.insert(key.to_string(), json!(value));
        let verdict = match (applies, ok) {
            (false, _) => "(size differs)".to_string(),
            (true, true) => "met".to_string(),
            (true, false) => format!("MISSED: {miss}"),
        };
        self.targets.insert(
            key.to_string(),
            json!({ "target": target, "met": ok, "applies": applies }),
        );
        self.rows.push(Row {
            figure: label.to_string(),
            value: shown,
            target: target.to_string(),
            verdict,
        });
    }

    pub(crate) fn counts(
        &mut self,
        key: &str,
        label: &str,
        counts: &BTreeMap<String, f64>,
        per: usize,
    ) {
        let per = per.max(1) as f64;
        let map: serde_json::Map<String, Value> = counts
            .iter()
            .map(|(k, v)| (k.clone(), json!((v / per * 1000.0).round() / 1000.0)))
            .collect();
        self.figures.insert(key.to_string(), Value::Object(map));
        if counts.is_empty() {
            self.rows.push(Row {
                figure: label.to_string(),
                value: "none".to_string(),
                target: String::new(),
                verdict: String::new(),
            });
        }
        for (i, (k, v)) in counts.iter().enumerate() {
            self.rows.push(Row {
                figure: if i == 0 {
                    label.to_string()
                } else {
                    String::new()
                },
                value: format!("{:.3}  {k}", v / per),
                target: String::new(),
                verdict: String::new(),
            });
        }
    }

    pub(crate) fn latencies(&mut self, key: &str, label: &str, mut lat: Vec<Duration>) {
        lat.sort();
        for (p, name) in [(0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (1.0, "max")] {
            let d = percentile(&lat, p);
            self.secs(&format!("{key}_{name}_s"), &format!("{label} {name}"), d);
        }
    }

    pub(crate) fn proc(&mut self, p: ProcStats) {
        self.mb("ccm_rss_mb", "CCM resident memory (VmRSS)", p.rss_kb);
        self.mb(
            "ccm_peak_rss_mb",
            "CCM peak resident memory (VmHWM)",
            p.hwm_kb,
        );
        self.fig(
            "ccm_cpu_s",
            "CCM CPU time since start",
            json!(p.cpu_s),
            format!("{:.2} s", p.cpu_s),
        );
    }

    pub(crate) fn print(&self, json_line: bool, machine: &Value) {
        let w0 = self.rows.iter().map(|r| r.figure.len()).max().unwrap_or(0);
        let w1 = self.rows.iter().map(|r| r.value.len()).max().unwrap_or(0);
        let w2 = self.rows.iter().map(|r| r.target.len()).max().unwrap_or(0);
        println!();
        println!("scale {} {}", self.scenario.name(), self.opts);
        println!(
            "machine: {} cores, {}, load {} -> {}; harness (in-process API server) peak RSS {} MB",
            machine["cores"],
            machine["cpu"],
            machine["load_start"],
            machine["load_end"],
            machine["harness_peak_rss_mb"]
        );
        println!("{}", "-".repeat(w0 + w1 + w2 + 20));
        for r in &self.rows {
            println!(
                "{:<w0$}  {:<w1$}  {:<w2$}  {}",
                r.figure, r.value, r.target, r.verdict
            );
        }
        for n in &self.notes {
            println!("note: {n}");
        }
        if json_line {
            let line = json!({
                "scenario": self.scenario.name(),
                "options": self.opts,
                "machine": machine,
                "figures": self.figures,
                "targets": self.targets,
                "notes": self.notes,
            });
            println!("{line}");
        }
    }
}

/// API requests by "verb resource[/subresource]".
pub(crate) fn request_counts(reqs: &[RequestRecord]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for r in reqs {
        let res = match &r.subresource {
            Some(s) => format!("{}/{s}", r.resource),
            None => r.resource.clone(),
        };
        let key = if r.status >= 400 {
            format!("{} {res} ({})", r.verb, r.status)
        } else {
            format!("{} {res}", r.verb)
        };
        *out.entry(key).or_insert(0.0) += 1.0;
    }
    out
}

/// Requests that change or create something (everything but get/list/watch).
pub(crate) fn writes(reqs: &[RequestRecord]) -> usize {
    reqs.iter()
        .filter(|r| !matches!(r.verb.as_str(), "get" | "list" | "watch"))
        .count()
}

/// API request figures: from the in-process request log, or from the CCM's own client metrics
/// on a real cluster.
pub(crate) fn api_figures(
    report: &mut Report,
    env: &Env,
    before: &Metrics,
    after: &Metrics,
    per: usize,
    unit: &str,
) -> Option<f64> {
    match env.ccm_requests() {
        Some(reqs) => {
            let total = reqs.len() as f64 / per.max(1) as f64;
            report.counts(
                &format!("api_requests_per_{unit}"),
                &format!("API requests per {unit}"),
                &request_counts(&reqs),
                per,
            );
            report.fig(
                &format!("api_writes_per_{unit}"),
                &format!("API writes per {unit}"),
                json!(writes(&reqs) as f64 / per.max(1) as f64),
                format!("{:.3}", writes(&reqs) as f64 / per.max(1) as f64),
            );
            let conflicts = reqs.iter().filter(|r| r.status == 409).count();
            report.fig(
                "api_conflicts",
                "API conflicts (409 answers to the CCM)",
                json!(conflicts),
                format!("{conflicts}"),
            );
            let gets = reqs.iter().filter(|r| r.verb == "get").count();
            report.fig(
                "api_gets",
                "API GETs by the CCM",
                json!(gets),
                format!("{gets}"),
            );
            Some(total)
        }
        None => {
            let m = diff(
                &after.by("rest_client_requests_total", "method"),
                &before.by("rest_client_requests_total", "method"),
            );
            let total: f64 = m.values().sum::<f64>() / per.max(1) as f64;
            report.counts(
                &format!("api_requests_per_{unit}"),
                &format!("API requests per {unit} (by method)"),
                &m,
                per,
            );
            Some(total)
        }
    }
}

/// Events recorded by the CCM between `before` and `after`
/// (`event_recorder_events_total{result}`), and when the last one landed relative to
/// `converged` (negative: before it).
pub(crate) fn event_figures(
    report: &mut Report,
    before: &Metrics,
    after: &Metrics,
    converged: Instant,
    last: &LastEvent,
) {
    let events = diff(
        &after.by("event_recorder_events_total", "result"),
        &before.by("event_recorder_events_total", "result"),
    );
    for result in [
        "written",
        "summarised",
        "summaries",
        "dropped",
        "failed",
        "filtered",
    ] {
        let n = events.get(result).copied().unwrap_or(0.0);
        report.fig(
            &format!("events_{result}"),
            &format!("Events {result}"),
            json!(n),
            format!("{}", n as u64),
        );
    }
    let last = *last.lock().unwrap();
    let landed = last.map(|l| {
        if l >= converged {
            secs(l - converged)
        } else {
            -secs(converged - l)
        }
    });
    report.fig(
        "events_last_after_convergence_s",
        "last Event landed, after convergence",
        json!(landed),
        landed.map_or_else(|| "none".to_string(), |s| format!("{s:.3} s")),
    );
}
