//! placeholder

pub mod fake_cloud;
