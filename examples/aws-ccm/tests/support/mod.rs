//! Shared by the test binaries: the moto server and the account set-up.
#![allow(dead_code, unreachable_pub)]

pub mod moto;
pub mod world;
