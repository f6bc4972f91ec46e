//! The conformance suite: FakeCloud passes it whole; each deliberately broken provider (FakeCloud
//! wrapped to break exactly one contract) fails exactly the check for that contract. One test
//! binary, a module per topic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod batch;
mod broken;
mod broken_provider;
mod classes;
mod ip_modes;
mod load_balancer_batch;
mod suite;
mod support;
