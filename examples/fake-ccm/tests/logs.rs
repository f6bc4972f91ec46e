//! The `fake-ccm` binary's log, read as a pipeline written for a Go CCM reads it: stderr to a
//! pipe (as in any pod), each line parsed as klog's text header (`--logging-format=text`) or
//! as component-base's JSON (`--logging-format=json`), and no escape character anywhere, not
//! even from a value that contains one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::sync::LazyLock;
use std::time::Duration;

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::kubelet_node;
use ccm_testing::wait::wait_for;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use regex::Regex;
use tokio::io::AsyncReadExt;

mod support;

/// klog's header, as Go's structured text logging writes it: severity, MMDD, time with
/// microseconds, the thread-id field right-aligned in 7, `file:line]`, the quoted message,
/// then ` key=value` pairs.
static KLOG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"^([IWEF])(\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6}) ([ \d]{7}) ([^ :\]]+):(\d+)\] "((?:[^"\\]|\\.)*)"(.*)$"#,
    )
    .unwrap()
});

/// One ` key=value` pair of klog's structured text: a Go-quoted string or a bare value.
static KV: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#"^ ([\w.-]+)=("(?:[^"\\]|\\.)*"|[^ "]+)"#).unwrap());

/// A klog line, taken apart.
#[derive(Debug)]
struct KlogLine {
    severity: char,
    at: jiff::Timestamp,
    pid: u32,
    file: String,
    message: String,
    /// The pairs in order; a string value with its quotes, a bare value without.
    pairs: Vec<(String, String)>,
}

fn parse_klog(line: &str) -> KlogLine {
    let c = KLOG
        .captures(line)
        .unwrap_or_else(|| panic!("not a klog line: {line:?}"));
    let n = |i: usize| c[i].parse::<i32>().unwrap();
    let now = jiff::Zoned::now();
    let at = jiff::civil::DateTime::new(
        now.year(),
        n(2) as i8,
        n(3) as i8,
        n(4) as i8,
        n(5) as i8,
        n(6) as i8,
        n(7) * 1000,
    )
    .unwrap()
    .to_zoned(now.time_zone().clone())
    .unwrap()
    .timestamp();
    let mut pairs = Vec::new();
    let mut rest = &c[12];
    while !rest.is_empty() {
        let kv = KV
            .captures(rest)
            .unwrap_or_else(|| panic!("not a key=value pair at {rest:?} in {line:?}"));
        pairs.push((kv[1].to_owned(), kv[2].to_owned()));
        rest = &rest[kv[0].len()..];
    }
    KlogLine {
        severity: c[1].chars().next().unwrap(),
        at,
        pid: c[8].trim().parse().unwrap(),
        file: c[9].to_owned(),
        message: unquote(&c[11]),
        pairs,
    }
}

/// Go's quoted string, read back (the escapes klog writes).
fn unquote(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next().unwrap() {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'x' => {
                let hex: String = chars.by_ref().take(2).collect();
                out.push(char::from(u8::from_str_radix(&hex, 16).unwrap()));
            }
            other => out.push(other),
        }
    }
    out
}

impl KlogLine {
    fn value(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Runs fake-ccm against an in-process API server with one Node whose first instance lookup
/// fails; waits for the Node to be initialised, stops it with SIGTERM and returns its stderr
/// and its process id.
async fn run_initialising_a_node(format: &str) -> (String, u32) {
    let server = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    let name = format!("logs-{format}-1");
    nodes
        .create(&PostParams::default(), &kubelet_node(&name).build())
        .await
        .unwrap();
    let config = std::env::temp_dir().join(format!(
        "fake-ccm-logs-{format}-{}.yaml",
        std::process::id()
    ));
    std::fs::write(
        &config,
        "zone: test-zone\nfaults:\n  instance_metadata:\n    - fail_next: 1\n",
    )
    .unwrap();
    let mut ccm = support::fake_ccm(&server, &config, 0)
        .arg(format!("--logging-format={format}"))
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = ccm.id().unwrap();
    let mut stderr = ccm.stderr.take().unwrap();
    let reader = tokio::spawn(async move {
        let mut out = String::new();
        stderr.read_to_string(&mut out).await.unwrap();
        out
    });
    wait_for(&nodes, &name, Duration::from_secs(60), |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_ref())
            .is_some()
    })
    .await
    .unwrap();
    let status = support::stop(&mut ccm).await;
    let log = reader.await.unwrap();
    assert!(status.success(), "fake-ccm exited with {status}: {log}");
    let _ = std::fs::remove_file(config);
    (log, pid)
}

/// Runs fake-ccm with a `--cloud-config` that does not exist and whose name holds an escape
/// sequence; returns its stderr (it exits non-zero at once).
async fn run_failing_startup(format: &str) -> String {
    let missing = std::env::temp_dir().join("no-such-\u{1b}[31m-config.yaml");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_fake-ccm"))
        .arg("--cloud-provider=fake")
        .arg(format!("--cloud-config={}", missing.display()))
        .arg(format!("--logging-format={format}"))
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    String::from_utf8(output.stderr).unwrap()
}

#[tokio::test]
async fn text_logs_are_klog_lines() {
    let (log, pid) = run_initialising_a_node("text").await;
    assert!(!log.contains('\u{1b}'), "an escape character: {log:?}");
    let lines: Vec<KlogLine> = log.lines().map(parse_klog).collect();
    let now = jiff::Timestamp::now();
    for line in &lines {
        assert_eq!(line.pid, pid, "{line:?}");
        assert!(line.file.ends_with(".rs"), "{line:?}");
        let age = now.duration_since(line.at).as_secs();
        assert!((0..600).contains(&age), "local time, now: {line:?}");
    }
    let find = |message: &str| {
        lines
            .iter()
            .find(|l| l.message == message)
            .unwrap_or_else(|| panic!("no line {message:?} in {log}"))
    };
    let started = find("starting cloud-controller-manager");
    assert_eq!(started.severity, 'I');
    assert_eq!(started.file, "start.rs");
    let failed = find("failed to sync node");
    assert_eq!(failed.severity, 'W');
    assert_eq!(failed.file, "sync.rs");
    assert_eq!(
        failed.pairs[0].0, "err",
        "err right after the message: {failed:?}"
    );
    assert!(failed.pairs[0].1.starts_with("\"fake cloud"), "{failed:?}");
    assert_eq!(failed.value("node"), Some("\"logs-text-1\""));
    let synced = find("node synced");
    assert_eq!(synced.severity, 'I');
    assert_eq!(synced.value("node"), Some("\"logs-text-1\""));
    let stopped = find("cloud-controller-manager stopped");
    assert_eq!(
        stopped.value("code"),
        Some("0"),
        "numbers bare: {stopped:?}"
    );
}

#[tokio::test]
async fn json_logs_have_gos_keys() {
    let (log, _) = run_initialising_a_node("json").await;
    assert!(!log.contains('\u{1b}'), "an escape character: {log:?}");
    let now_ms = jiff::Timestamp::now().as_millisecond() as f64;
    let caller = Regex::new(r"^(?:[\w.-]+/)?[\w.-]+\.rs:\d+$").unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    for line in &lines {
        let ts = line["ts"].as_f64().unwrap_or_else(|| panic!("ts: {line}"));
        assert!(
            (0.0..600_000.0).contains(&(now_ms - ts)),
            "ts in milliseconds: {line}"
        );
        assert!(caller.is_match(line["caller"].as_str().unwrap()), "{line}");
        assert!(line["msg"].is_string(), "{line}");
        assert!(line.get("level").is_none(), "{line}");
        assert_eq!(line["v"], 0, "no errors here, all at -v=0: {line}");
    }
    let find = |msg: &str| {
        lines
            .iter()
            .find(|l| l["msg"] == msg)
            .unwrap_or_else(|| panic!("no line {msg:?} in {log}"))
    };
    let failed = find("failed to sync node");
    assert!(
        failed["err"].as_str().unwrap().starts_with("fake cloud"),
        "{failed}"
    );
    assert_eq!(failed["node"], "logs-json-1");
    assert!(
        failed["caller"]
            .as_str()
            .unwrap()
            .starts_with("cloud_node/sync.rs:")
    );
    assert_eq!(find("node synced")["node"], "logs-json-1");
    assert_eq!(find("cloud-controller-manager stopped")["code"], 0);
}

#[tokio::test]
async fn an_error_is_an_e_line_and_a_json_line_without_v_and_escapes_are_quoted() {
    let text = run_failing_startup("text").await;
    assert!(!text.contains('\u{1b}'), "{text:?}");
    let error = text
        .lines()
        .map(parse_klog)
        .find(|l| l.severity == 'E')
        .unwrap_or_else(|| panic!("no E line in {text}"));
    assert!(
        error
            .message
            .contains("invalid value for --cloud-config: cannot read")
            && error.message.contains("no-such-\u{1b}[31m-config.yaml"),
        "{error:?}"
    );

    let json = run_failing_startup("json").await;
    assert!(!json.contains('\u{1b}'), "{json:?}");
    let error: serde_json::Value = json
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l.get("v").is_none())
        .unwrap_or_else(|| panic!("no error line (no v) in {json}"));
    let msg = error["msg"].as_str().unwrap();
    assert!(msg.contains("no-such-\u{1b}[31m-config.yaml"), "{error}");
}
