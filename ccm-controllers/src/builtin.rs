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
    vec![route_controller()]
}

/// `node-route-controller` (`route`): runs when `--configure-cloud-routes` and the provider has
/// routes (the runtime has already checked `--cluster-cidr` then).
fn route_controller() -> ControllerEntry {
    use crate::route::{CONTROLLER_ALIAS, CONTROLLER_NAME, RouteConfig};
    ControllerEntry::new(CONTROLLER_NAME, |ctx, args| async move {
        let o = &args.options;
        if !o.configure_cloud_routes() {
            tracing::info!("--configure-cloud-routes=false: not configuring cloud routes");
            return Ok(());
        }
        let cluster_cidrs = o
            .cluster_cidrs()
            .map_err(|e| crate::ControllerError::Config {
                controller: CONTROLLER_NAME,
                message: e.0,
            })?;
        crate::route::run(
            ctx,
            RouteConfig {
                cluster_cidrs,
                reconciliation_period: o.route_reconciliation_period(),
                ..RouteConfig::default()
            },
        )
        .await
    })
    .alias(CONTROLLER_ALIAS)
}
