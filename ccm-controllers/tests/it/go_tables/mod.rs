//! Go-style table tests: one table per controller, each case the objects given, the cloud's
//! chosen answers per Node (`FakeCloud`'s `.node(..)`), the cloud calls expected with their
//! arguments (`FakeCloud::call_log`) and the API writes expected with their bodies (the
//! in-process API server's request log), as in k8s.io/cloud-provider's controller tests. Each
//! case runs the real controller through `ControllerHarness` on its own in-process API server;
//! the log is cleared once the case's objects are created, so every write left in it is the
//! controller's (the harness's controllers share the test's client and send no per-controller
//! user agent, so `RequestFilter::user_agent_suffix` cannot pick them out).
//!
//! The request log exists only on the in-process server, so these tests skip when
//! `CCM_TEST_KUBECONFIG` names a real cluster.
// Printing is the point here: the skip message, and what a case saw in a failing test's output.
#![allow(clippy::print_stdout)]

use std::time::Duration;

use ccm_core::NodeAddress;
use ccm_testing::KUBECONFIG_ENV;
use ccm_testing::apiserver::{ApiServer, RequestFilter};
use ccm_testing::fake_cloud::{CallArgs, FakeCloud};
use serde_json::{Value, json};

mod cloud_node;
mod node_lifecycle;
mod route;
mod service;

/// True (after saying why) when the tests run against a real cluster, which has no request log.
fn skip_on_real_cluster(test: &str) -> bool {
    if std::env::var_os(KUBECONFIG_ENV).is_some() {
        println!("{test}: skipped, the request log exists only on the in-process API server");
        return true;
    }
    false
}

/// One API write: `verb resource_path name` and the body sent.
#[derive(Debug, PartialEq)]
struct Write {
    what: String,
    body: Value,
}

fn write(what: &str, body: Value) -> Write {
    Write {
        what: what.into(),
        body,
    }
}

/// The writes made since the log was last cleared, Events left out (they are written
/// asynchronously), each body with the JSON strings `placeholders` name (values that differ per
/// run: UIDs, resourceVersions) replaced by their placeholders, so a table can state them.
fn writes(server: &ApiServer, placeholders: &[(&str, &str)]) -> Vec<Write> {
    server
        .requests_matching(&RequestFilter::new().writes())
        .into_iter()
        .filter(|w| w.resource != "events")
        .map(|w| {
            let mut body = serde_json::to_string(&w.body.clone().unwrap_or(Value::Null)).unwrap();
            for (value, placeholder) in placeholders {
                body = body.replace(&format!("\"{value}\""), &format!("\"{placeholder}\""));
            }
            Write {
                what: format!(
                    "{} {} {}",
                    w.verb,
                    w.resource_path(),
                    w.name.as_deref().unwrap_or("")
                ),
                body: without_times(serde_json::from_str(&body).unwrap()),
            }
        })
        .collect()
}

/// `body` with every condition timestamp replaced by `<time>`.
fn without_times(mut body: Value) -> Value {
    match &mut body {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                *value = if key == "lastHeartbeatTime" || key == "lastTransitionTime" {
                    json!("<time>")
                } else {
                    without_times(value.take())
                };
            }
        }
        Value::Array(items) => {
            for item in items.iter_mut() {
                *item = without_times(item.take());
            }
        }
        _ => {}
    }
    body
}

/// Every call the cloud received, in order, as `(operation, arguments)` (`initialize` left out).
fn cloud_calls(cloud: &FakeCloud) -> Vec<(String, CallArgs)> {
    cloud
        .call_log()
        .into_iter()
        .filter(|c| c.operation != "initialize")
        .map(|c| (c.operation, c.args))
        .collect()
}

/// The cloud calls a case expects.
#[derive(Debug)]
enum Calls {
    /// Exactly these, in this order.
    Exactly(Vec<(String, CallArgs)>),
    /// This sequence, repeated (a failing call retried with backoff, or a periodic pass): made
    /// at least this many times, nothing else made; how often depends on how long the
    /// controller ran.
    Repeated(Vec<(String, CallArgs)>, usize),
}

impl Calls {
    fn check(&self, case: &str, calls: &[(String, CallArgs)]) {
        match self {
            Calls::Exactly(expected) => assert_eq!(calls, expected, "case {case}: cloud calls"),
            Calls::Repeated(expected, at_least) => assert!(
                calls.len() >= expected.len() * at_least
                    && calls.len().is_multiple_of(expected.len())
                    && calls
                        .chunks(expected.len())
                        .all(|c| c == expected.as_slice()),
                "case {case}: expected {expected:?} repeated; got {calls:?}"
            ),
        }
    }
}

fn call(op: &str, args: CallArgs) -> (String, CallArgs) {
    (op.into(), args)
}

/// The arguments of an `InstancesV2` call for Node `name`.
fn node_args(name: &str, provider_id: Option<&str>) -> CallArgs {
    CallArgs::Node {
        name: name.into(),
        provider_id: provider_id.map(Into::into),
    }
}

/// Prints what a case saw, for the captured output of a failing case.
fn dump(case: &str, calls: &[(String, CallArgs)], writes: &[Write]) {
    println!("case {case}: cloud calls {calls:?}");
    for w in writes {
        println!("case {case}: {} {}", w.what, w.body);
    }
}

/// How long a case waits for a periodic controller's writes.
const SHORT: Duration = Duration::from_secs(20);

fn internal_ip(ip: &str) -> NodeAddress {
    NodeAddress {
        type_: "InternalIP".into(),
        address: ip.into(),
    }
}
