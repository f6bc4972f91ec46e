//! Test harness for Rust cloud-controller-managers.
//!
//! ## The in-process API server and `TestCluster`
//!
//! [`apiserver::ApiServer`] is a Kubernetes API server that runs inside the test process and
//! behaves like kube-apiserver for what a cloud-controller-manager uses (see its module docs
//! for the exact semantics). [`TestCluster`] is the one entry point tests use: it starts an
//! `ApiServer`, or — when the environment variable `CCM_TEST_KUBECONFIG` names a kubeconfig —
//! talks to that real cluster instead, so the same test runs both ways. [`builders`] make
//! objects as kubelet and users create them, [`wait`] polls for conditions with failure
//! messages that show the last object seen.
//!
//! ```no_run
//! use std::time::Duration;
//! use ccm_testing::{TestCluster, builders::kubelet_node, wait::wait_for};
//! use k8s_openapi::api::core::v1::Node;
//! use kube::Api;
//!
//! # async fn example() {
//! let cluster = TestCluster::start().await;
//! let name = cluster.unique_name("node");
//! cluster.create(&kubelet_node(&name).build()).await;
//! let nodes: Api<Node> = Api::all(cluster.client());
//! // ... run the controller under test, then:
//! let node = wait_for(&nodes, &name, Duration::from_secs(20), |n: &Node| {
//!     n.spec.as_ref().and_then(|s| s.provider_id.as_ref()).is_some()
//! })
//! .await
//! .expect("the provider ID is set");
//! cluster.cleanup().await;
//! # }
//! ```
//!
//! ## Testing a provider
//!
//! [`fake_cloud::FakeCloud`] is a configurable provider (latency, missing and shut-down
//! instances, faults, call recording) for testing controllers; the [`conformance`] suite runs a
//! provider, yours or the fake, against the contract of `ccm-core`:
//!
//! ```
//! use ccm_core::{Node, ObjectMeta};
//! use ccm_testing::conformance::{Check, ConformanceInput, Suite};
//! use ccm_testing::fake_cloud::FakeCloud;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let worker = Node {
//!     metadata: ObjectMeta { name: Some("worker-1".into()), ..Default::default() },
//!     ..Default::default()
//! };
//! let cloud = FakeCloud::builder().missing_node("gone-.*").build(); // swap in your provider
//! let mut gone = worker.clone();
//! gone.metadata.name = Some("gone-1".into());
//! let suite = Suite::new(cloud.provider(), ConformanceInput::new("test", vec![worker]).missing_node(gone));
//! let result = suite.run_check(Check::InstanceExistsFalseForUnknown).await;
//! assert!(result.outcome.is_passed(), "{result}");
//! # }
//! ```
#![warn(missing_docs)]

pub mod apiserver;
pub mod builders;
mod cluster;
pub mod conformance;
pub mod fake_cloud;
pub mod harness;
pub mod logging;
pub mod partition;
mod shared_lock;
pub mod wait;

pub use cluster::{KUBECONFIG_ENV, TestCluster};
