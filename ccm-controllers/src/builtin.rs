//! The table of built-in controllers: canonical name, aliases, and how to start each from the
//! [`ControllerContext`](crate::ControllerContext) and the parsed [`Options`](crate::Options).
//!
//! An entry looks like this (the flag → config mapping is plain data on
//! [`Options`](crate::Options)):
//!
//! ```ignore
//! ControllerEntry::new("cloud-node-controller", |ctx, args| async move {
//!     let o = &args.options;
//!     crate::cloud_node::run(ctx, crate::cloud_node::CloudNodeConfig {
//!         workers: o.node_sync_workers(),
//!         status_update_workers: o.node_status_update_workers(),
//!         status_update_frequency: o.node_status_update_frequency(),
//!         ..Default::default()
//!     })
//!     .await
//! })
//! .alias("cloud-node"),
//! ```

use crate::runtime::ControllerEntry;

/// The built-in controllers, in start order. Only controllers whose modules exist are listed.
pub(crate) fn builtin_controllers() -> Vec<ControllerEntry> {
    Vec::new()
}
