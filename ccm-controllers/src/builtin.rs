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

/// The built-in controllers, in start order, with their client names (Go's
/// `DefaultInitFuncConstructors`).
pub(crate) fn builtin_controllers() -> Vec<ControllerEntry> {
    vec![
        cloud_node_controller(),
        node_lifecycle_controller(),
        service_controller(),
        route_controller(),
    ]
}

/// `cloud-node-controller` (`cloud-node`): initialises tainted Nodes and refreshes addresses.
fn cloud_node_controller() -> ControllerEntry {
    use crate::cloud_node::{CONTROLLER_NAME, CloudNodeConfig};
    ControllerEntry::new(CONTROLLER_NAME, |ctx, args| async move {
        let o = &args.options;
        crate::cloud_node::run(
            ctx,
            CloudNodeConfig {
                workers: o.node_sync_workers(),
                status_update_frequency: o.node_status_update_frequency(),
                status_update_workers: o.node_status_update_workers(),
            },
        )
        .await
    })
    .alias("cloud-node")
    .client("node-controller")
}

/// `cloud-node-lifecycle-controller` (`cloud-node-lifecycle`): deletes Nodes whose instances
/// are gone (after the grace period), taints shut-down ones.
fn node_lifecycle_controller() -> ControllerEntry {
    use crate::node_lifecycle::{CONTROLLER_NAME, NodeLifecycleConfig};
    ControllerEntry::new(CONTROLLER_NAME, |ctx, args| async move {
        let o = &args.options;
        crate::node_lifecycle::run(
            ctx,
            NodeLifecycleConfig {
                monitor_period: o.node_monitor_period(),
                deletion_grace_period: o.node_deletion_grace_period(),
                ..NodeLifecycleConfig::default()
            },
        )
        .await
    })
    .alias("cloud-node-lifecycle")
    .client("node-controller")
}

/// `service-lb-controller` (`service`): load balancers for `type: LoadBalancer` Services.
fn service_controller() -> ControllerEntry {
    use crate::service::ServiceConfig;
    ControllerEntry::new("service-lb-controller", |ctx, args| async move {
        let o = &args.options;
        crate::service::run(
            ctx,
            ServiceConfig {
                workers: o.service_workers(),
                node_sync_window: o.node_sync_window(),
            },
        )
        .await
    })
    .alias("service")
    .client("service-controller")
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
    .client("route-controller")
}
