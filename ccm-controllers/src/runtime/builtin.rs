//! The table of built-in controllers: canonical name, aliases, and how to start each from the
//! [`ControllerContext`](crate::ControllerContext) and the parsed [`Options`](crate::options::Options).
//!
//! An entry looks like this (the flag → config mapping is plain data on
//! [`Options`](crate::options::Options)):
//!
//! ```ignore
//! ControllerEntry::new("cloud-node-controller", |ctx, args| async move {
//!     let o = &args.options;
//!     crate::controllers::cloud_node::run(ctx, crate::controllers::cloud_node::CloudNodeConfig {
//!         workers: o.node_sync_workers(),
//!         status_update_workers: o.node_status_update_workers(),
//!         status_update_frequency: o.node_status_update_frequency(),
//!         ..Default::default()
//!     })
//!     .await
//! })
//! .alias("cloud-node"),
//! ```

use crate::runtime::entry::ControllerEntry;

/// The built-in controllers, in start order (Go's `DefaultInitFuncConstructors`).
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
    use crate::controllers::cloud_node::{ALIAS, CloudNodeConfig, NAME};
    ControllerEntry::new(NAME, |ctx, args| async move {
        let o = &args.options;
        crate::controllers::cloud_node::run(
            ctx,
            CloudNodeConfig {
                workers: o.node_sync_workers(),
                status_update_frequency: o.node_status_update_frequency(),
                status_update_workers: o.node_status_update_workers(),
            },
        )
        .await
    })
    .alias(ALIAS)
}

/// `cloud-node-lifecycle-controller` (`cloud-node-lifecycle`): deletes Nodes whose instances
/// are gone (after the grace period), taints shut-down ones.
fn node_lifecycle_controller() -> ControllerEntry {
    use crate::controllers::node_lifecycle::{ALIAS, NAME, NodeLifecycleConfig};
    ControllerEntry::new(NAME, |ctx, args| async move {
        let o = &args.options;
        crate::controllers::node_lifecycle::run(
            ctx,
            NodeLifecycleConfig {
                monitor_period: o.node_monitor_period(),
                deletion_grace_period: o.node_deletion_grace_period(),
                ..NodeLifecycleConfig::default()
            },
        )
        .await
    })
    .alias(ALIAS)
}

/// `service-lb-controller` (`service`): load balancers for `type: LoadBalancer` Services.
fn service_controller() -> ControllerEntry {
    use crate::controllers::service::{ALIAS, NAME, ServiceConfig};
    ControllerEntry::new(NAME, |ctx, args| async move {
        let o = &args.options;
        crate::controllers::service::run(
            ctx,
            ServiceConfig {
                workers: o.service_workers(),
                node_sync_window: o.node_sync_window(),
            },
        )
        .await
    })
    .alias(ALIAS)
}

/// `node-route-controller` (`route`): runs when `--configure-cloud-routes` and the provider has
/// routes (the runtime has already checked `--cluster-cidr` then).
fn route_controller() -> ControllerEntry {
    use crate::controllers::route::{ALIAS, NAME, RouteConfig};
    ControllerEntry::new(NAME, |ctx, args| async move {
        let o = &args.options;
        if !o.configure_cloud_routes() {
            tracing::info!("--configure-cloud-routes=false: not configuring cloud routes");
            return Ok(());
        }
        let cluster_cidrs =
            o.cluster_cidrs()
                .map_err(|e| crate::machinery::error::ControllerError::Config {
                    controller: NAME,
                    message: e.0,
                })?;
        crate::controllers::route::run(
            ctx,
            RouteConfig {
                cluster_cidrs,
                reconciliation_period: o.route_reconciliation_period(),
                ..RouteConfig::default()
            },
        )
        .await
    })
    .alias(ALIAS)
}
