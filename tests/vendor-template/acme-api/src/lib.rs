//! The Acme cloud's SDK as the guide's provider uses it: the in-memory stand-in that
//! docs/writing-a-provider.md compiles its code against, made a crate.

include!("../../../../docs/acme/acme_api.rs");

pub use self::acme_api::*;
