//! The in-process API server, checked against what kube-apiserver does, through a real
//! `kube::Client` over HTTP: one test binary, a module per topic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod auth;
mod behaviours;
mod defaults_validation;
mod faults;
mod fidelity;
mod list_watch;
mod objects;
mod options;
mod patches;
mod protocol;
mod reviews;
mod runtime;
mod storage;
mod support;
