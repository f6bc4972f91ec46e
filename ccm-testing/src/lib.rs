//! placeholder

pub mod conformance;
pub mod fake_cloud;
