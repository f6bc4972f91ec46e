//! FakeCloud: one test (at least) per configuration field and per fault mode; one test binary,
//! a module per topic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod answers;
mod call_log;
mod config;
mod instances;
mod latency_faults;
mod load_balancers_routes;
mod support;
