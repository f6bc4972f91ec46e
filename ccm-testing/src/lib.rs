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
#![warn(missing_docs)]

pub mod apiserver;
pub mod builders;
mod cluster;
pub mod wait;

pub use cluster::{KUBECONFIG_ENV, TestCluster};
