//! The monitoring files in `examples/deploy/monitoring/` read metrics that exist: every metric
//! name in the rules' expressions and the dashboard's queries is parsed out of the files and
//! looked for in the `/metrics` of live `fake-ccm` processes (an incumbent with leader
//! election and a shadow beside it), scraped over HTTPS with a bearer token the API server
//! authenticates and authorises. And each rule has a unit test, each alert a runbook.
//!
//! prometheus-client leaves a labelled family out of the exposition until its first sample
//! (no `# TYPE` line either), so the test makes the events happen rather than accept a
//! declaration: Nodes are initialised, a load balancer's first ensure fails and is retried,
//! the shadow disagrees with the incumbent about a Node's zone and sees a Node the incumbent
//! has not initialised. A name counts only when a sample of it is exposed (`_total` of a
//! counter, `_bucket`/`_sum`/`_count` of a histogram, as the expressions write them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, PostParams};
use regex::Regex;
use support::free_port;

const TOKEN: &str = "monitoring-test-scraper-token";
const SCRAPER: &str = "system:serviceaccount:monitoring:prometheus";

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

fn read(file: &str) -> String {
    let path = monitoring_dir().join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rules of `rules.yaml`: (alert or record name, is an alert, expression, annotations).
struct Rule {
    name: String,
    alert: bool,
    expr: String,
    runbook_url: Option<String>,
}

fn rules() -> Vec<Rule> {
    let doc: serde_norway::Value = serde_norway::from_str(&read("rules.yaml")).unwrap();
    let mut rules = Vec::new();
    for group in doc["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let (name, alert) = match (rule["alert"].as_str(), rule["record"].as_str()) {
                (Some(alert), None) => (alert, true),
                (None, Some(record)) => (record, false),
                _ => panic!("a rule is an alert or a record: {rule:?}"),
            };
            rules.push(Rule {
                name: name.to_owned(),
                alert,
                expr: rule["expr"].as_str().expect("expr").to_owned(),
                runbook_url: rule["annotations"]["runbook_url"]
                    .as_str()
                    .map(str::to_owned),
            });
        }
    }
    rules
}

/// Every PromQL query of `dashboard.json` (`expr` of the targets, `definition` of the
/// variables; Grafana's `label_values(metric, label)` reduced to its metric).
fn dashboard_queries() -> Vec<String> {
    fn walk(node: &serde_json::Value, out: &mut Vec<String>) {
        match node {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value.as_str()) {
                        ("expr" | "definition", Some(query)) => out.push(query.to_owned()),
                        _ => walk(value, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    let dashboard: serde_json::Value = serde_json::from_str(&read("dashboard.json")).unwrap();
    assert_eq!(
        dashboard["__inputs"][0]["pluginId"], "prometheus",
        "importable: the datasource is an input"
    );
    let mut queries = Vec::new();
    walk(&dashboard, &mut queries);
    queries
        .into_iter()
        .map(|q| match q.strip_prefix("label_values(") {
            Some(rest) => rest.split(',').next().unwrap().to_owned(),
            None => q,
        })
        .collect()
}

/// The metric names a PromQL expression reads, with the label names its selectors match on
/// (`job` and `instance` left out: Prometheus adds them). Strings, ranges, and the label lists
/// of `by`/`without`/`on`/`ignoring`/`group_*` are removed first; what is left that is an
/// identifier, not a function call, a keyword or a Grafana variable, is a metric name.
fn metric_names(expr: &str) -> BTreeMap<String, BTreeSet<String>> {
    let strings = Regex::new(r#""(?:[^"\\]|\\.)*""#).unwrap();
    let ranges = Regex::new(r"\[[^\]]*\]").unwrap();
    let label_lists =
        Regex::new(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)").unwrap();
    let selector = Regex::new(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^}]*)\}").unwrap();
    let identifier = Regex::new(r"\$?[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?").unwrap();
    let keywords = ["and", "or", "unless", "offset", "bool", "inf", "nan"];
    let cleaned = strings.replace_all(expr, "\"\"");
    let cleaned = ranges.replace_all(&cleaned, " ");
    let cleaned = label_lists.replace_all(&cleaned, " ");
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for selector in selector.captures_iter(&cleaned) {
        let Some(name) = selector.get(1) else {
            continue;
        };
        let labels = names.entry(name.as_str().to_owned()).or_default();
        for matcher in selector[2].split(',').filter(|m| !m.trim().is_empty()) {
            let label = matcher
                .split(['=', '!', '~'])
                .next()
                .unwrap()
                .trim()
                .to_owned();
            if label != "job" && label != "instance" {
                labels.insert(label);
            }
        }
    }
    let without_selectors = Regex::new(r"\{[^}]*\}").unwrap().replace_all(&cleaned, " ");
    for m in identifier.find_iter(&without_selectors) {
        let token = m.as_str();
        // A digit before it makes it a number's tail (`5m`, `1e3`): identifiers only.
        let preceded_by_digit = without_selectors[..m.start()]
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_digit() || c == '.');
        if token.ends_with('(')
            || token.starts_with('$')
            || preceded_by_digit
            || keywords.contains(&token.to_ascii_lowercase().as_str())
        {
            continue;
        }
        names.entry(token.to_owned()).or_default();
    }
    names
}

/// The sample names of an exposition, each with the label names its samples carry.
fn exposed(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let series = line.rsplit_once(' ').map_or(line, |(s, _)| s);
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let entry = out.entry(name.to_owned()).or_default();
        for pair in labels.trim_end_matches('}').split(',') {
            if let Some((label, _)) = pair.split_once('=') {
                entry.insert(label.to_owned());
            }
        }
    }
    out
}

/// Every metric the rules and the dashboard read, with the label names they match on; and
/// the recording rules' own names, which are Prometheus's, not the CCM's.
fn wanted() -> BTreeMap<String, BTreeSet<String>> {
    let rules = rules();
    let recorded: BTreeSet<&str> = rules
        .iter()
        .filter(|r| !r.alert)
        .map(|r| r.name.as_str())
        .collect();
    let mut wanted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let exprs = rules
        .iter()
        .map(|r| r.expr.clone())
        .chain(dashboard_queries());
    for expr in exprs {
        for (name, labels) in metric_names(&expr) {
            if name.contains(':') {
                assert!(
                    recorded.contains(name.as_str()),
                    "{name} (in {expr:?}) is no recording rule of rules.yaml"
                );
                continue;
            }
            wanted.entry(name).or_default().extend(labels);
        }
    }
    wanted
}

#[test]
fn the_expression_parser_finds_metrics_not_functions_labels_or_numbers() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le, operation) (rate(a_bucket{job=~"$job",operation!="x,y"}[$__rate_interval])))
           / on (job, instance) b_total offset 5m > 1e3 and max_over_time(c[15m]) == 1 unless d:rec"#,
    );
    let got: Vec<(&str, Vec<&str>)> = names
        .iter()
        .map(|(n, l)| (n.as_str(), l.iter().map(String::as_str).collect()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a_bucket", vec!["operation"]),
            ("b_total", vec![]),
            ("c", vec![]),
            ("d:rec", vec![]),
        ]
    );
}

/// Each alert has a unit test in which it fires, each recording rule one that checks its
/// value, and each alert's `runbook_url` points at a heading of docs/operating.md.
#[test]
fn every_rule_is_tested_and_every_alert_has_a_runbook() {
    let tests: serde_norway::Value = serde_norway::from_str(&read("rules_test.yaml")).unwrap();
    let mut fired = BTreeSet::new();
    let mut silent = BTreeSet::new();
    let mut checked_exprs = Vec::new();
    for test in tests["tests"].as_sequence().unwrap() {
        for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = case["alertname"].as_str().unwrap().to_owned();
            if case["exp_alerts"]
                .as_sequence()
                .is_some_and(|a| !a.is_empty())
            {
                fired.insert(name);
            } else {
                silent.insert(name);
            }
        }
        for case in test["promql_expr_test"].as_sequence().into_iter().flatten() {
            checked_exprs.push(case["expr"].as_str().unwrap().to_owned());
        }
    }
    let operating = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operating.md"),
    )
    .unwrap();
    // GitHub's anchors: the heading lower-cased, spaces to '-', other punctuation dropped.
    let anchors: BTreeSet<String> = operating
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| {
            h.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect();
    for rule in rules() {
        if rule.alert {
            assert!(
                fired.contains(&rule.name),
                "{}: no test fires it",
                rule.name
            );
            let url = rule.runbook_url.as_deref().unwrap_or_else(|| {
                panic!("{}: no runbook_url", rule.name);
            });
            let anchor = url
                .strip_prefix("https://github.com/ccm-rs/ccm-rs/blob/main/docs/operating.md#")
                .unwrap_or_else(|| panic!("{}: runbook_url {url}", rule.name));
            assert_eq!(anchor, rule.name.to_lowercase(), "{}", rule.name);
            assert!(
                anchors.contains(anchor),
                "{}: docs/operating.md has no heading for #{anchor}",
                rule.name
            );
        } else {
            assert!(
                checked_exprs.iter().any(|e| e.contains(&rule.name)),
                "recording rule {} has no promql_expr_test",
                rule.name
            );
        }
    }
    // The silent cases: every alert's test also has series that must not fire it (the
    // non-firing series sit beside the firing ones; these alerts also check a time before
    // `for` has passed or after the alert resolves).
    assert!(
        silent.len() >= 8,
        "alerts with an empty expectation: {silent:?}"
    );
}

struct Ccm {
    process: tokio::process::Child,
    port: u16,
    name: &'static str,
    /// Its stderr (the log), shown when the test fails.
    log: PathBuf,
}

fn start_ccm(server: &ApiServer, name: &'static str, cloud_config: &str, extra: &[&str]) -> Ccm {
    let file = |ext: &str| {
        std::env::temp_dir().join(format!(
            "fake-ccm-monitoring-{name}-{}.{ext}",
            std::process::id()
        ))
    };
    let (config, log) = (file("yaml"), file("log"));
    std::fs::write(&config, cloud_config).unwrap();
    let port = free_port();
    let process = tokio::process::Command::new(env!("CARGO_BIN_EXE_fake-ccm"))
        .arg(format!("--master={}", server.url()))
        .arg("--cloud-provider=fake")
        .arg(format!("--cloud-config={}", config.display()))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--secure-port={port}"))
        // The route controller too (its metrics are on the dashboard).
        .arg("--allocate-node-cidrs=true")
        .arg("--cluster-cidr=10.244.0.0/16")
        .arg("--configure-cloud-routes=true")
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    Ccm {
        process,
        port,
        name,
        log,
    }
}

/// `GET https://127.0.0.1:<port>/metrics` with the scraper's token (the certificate is the
/// CCM's self-signed one).
async fn scrape(ccm: &Ccm) -> Result<String, String> {
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let response = client
        .get(format!("https://127.0.0.1:{}/metrics", ccm.port))
        .bearer_auth(TOKEN)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response.text().await.map_err(|e| e.to_string())?;
    if status.is_success() {
        Ok(body)
    } else {
        Err(format!("{status}: {body}"))
    }
}

#[tokio::test]
async fn every_metric_of_the_rules_and_the_dashboard_is_exposed_by_fake_ccm() {
    let wanted = wanted();
    assert!(wanted.len() > 30, "parsed {} metric names", wanted.len());

    let server = ApiServer::start().await;
    server.add_token(TOKEN, SCRAPER, &[]);
    server.allow_non_resource(SCRAPER, "get", "/metrics");
    let nodes: Api<Node> = Api::all(server.client());
    let services: Api<Service> = Api::namespaced(server.client(), "default");
    // worker-1 is initialised by the incumbent (in zone-a; the shadow's cloud says zone-b: a
    // divergence); pending-1 is not (the incumbent's cloud does not know it: the shadow's
    // planned initialisation stays pending).
    for name in ["worker-1", "pending-1"] {
        nodes
            .create(&PostParams::default(), &kubelet_node(name).build())
            .await
            .unwrap();
    }
    // Its first ensure fails: one retry of the service queue.
    services
        .create(
            &PostParams::default(),
            &load_balancer_service("default", "web")
                .port("http", 80)
                .build(),
        )
        .await
        .unwrap();

    let mut incumbent = start_ccm(
        &server,
        "incumbent",
        "zone: zone-a\nmissing_nodes: [\"pending-.*\"]\n\
         faults: {ensure_load_balancer: [{fail_next: 1}]}\n",
        &[
            "--leader-elect=true",
            "--leader-elect-resource-namespace=kube-system",
            "--leader-elect-resource-name=cloud-controller-manager",
        ],
    );
    let mut shadow = start_ccm(
        &server,
        "shadow",
        "zone: zone-b\n",
        &["--shadow", "--shadow-pending-grace=1h"],
    );

    // Scrape both until every wanted metric is exposed by one of them (at most 90 s).
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last_errors = Vec::new();
    let missing = loop {
        let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        last_errors.clear();
        for ccm in [&incumbent, &shadow] {
            match scrape(ccm).await {
                Ok(text) => {
                    for (name, labels) in exposed(&text) {
                        seen.entry(name).or_default().extend(labels);
                    }
                }
                Err(e) => last_errors.push(format!("{}: {e}", ccm.name)),
            }
        }
        let missing: Vec<String> = wanted
            .iter()
            .filter_map(|(name, labels)| match seen.get(name) {
                None => Some(format!("{name} (not exposed)")),
                Some(have) => {
                    let lacking: Vec<&String> = labels.difference(have).collect();
                    (!lacking.is_empty())
                        .then(|| format!("{name} (no label {lacking:?}; has {have:?})"))
                }
            })
            .collect();
        let exited = [&mut incumbent, &mut shadow]
            .into_iter()
            .any(|c| c.process.try_wait().unwrap().is_some());
        if missing.is_empty() || exited || Instant::now() > deadline {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let logs: String = [&incumbent, &shadow]
        .iter()
        .map(|c| {
            let log = std::fs::read_to_string(&c.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("--- {} log (last lines):\n{}\n", c.name, tail.join("\n"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "read by examples/deploy/monitoring but not exposed by fake-ccm:\n{}\nscrape errors: {last_errors:?}\n{logs}",
        missing.join("\n")
    );
}
