//! The integration tests of `ccm-controllers`, as one test binary: one module per topic, and
//! the helpers they share in [`support`]. One binary links the crate and its dependencies once
//! instead of once per file; run one topic with `cargo test -p ccm-controllers --test it
//! <module>::` (e.g. `cloud_node::`).
//!
//! Controller and scenario tests run the real controllers against the in-process API server
//! of `ccm-testing` over real HTTP, or against the real cluster named by
//! `CCM_TEST_KUBECONFIG` where a test says it can.
//!
//! Two tests run in test binaries of their own, because they touch the whole process:
//! `tests/runtime_logs.rs` (it installs the process's global tracing subscriber to read the
//! runtime's log lines) and `tests/runtime_signal.rs` (it sends the process a SIGTERM).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod architecture;
mod cloud_node;
mod events;
mod flags;
mod go_tables;
mod initial_list;
mod instance_batch;
mod lease_renewal;
mod node_cloud_state;
mod node_ipam;
mod node_lifecycle;
mod ownership;
mod partition;
mod rbac;
mod route;
mod route_runtime;
mod runtime;
mod runtime_cluster;
mod secure_serving;
mod service;
mod service_accounts;
mod service_backends;
mod service_classes;
mod service_conditions;
mod service_hosts_batch;
mod service_ip_mode;
mod service_leaks;
mod service_nodes;
mod shadow;
mod startup;
mod vendor_manifests;
mod vendor_template;
