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

use crate::controllers::node_ipam::{self, CidrAllocators, NodeIpamConfig};
use crate::machinery::error::ControllerError;
use crate::options::Options;
use crate::runtime::entry::ControllerEntry;

/// The built-in controllers, in start order, with their client names (Go's
/// `DefaultInitFuncConstructors`, plus the `nodeipam` controller Kubernetes' own CCM template
/// registers): the table [`Builder::new`](crate::Builder::new) starts from, and the controller
/// harness of `ccm-testing` starts from too.
pub fn builtin_controllers() -> Vec<ControllerEntry> {
    vec![
        cloud_node_controller(),
        node_lifecycle_controller(),
        service_controller(),
        route_controller(),
        node_ipam_controller(CidrAllocators::default()),
    ]
}

/// `node-ipam-controller` (`nodeipam`): pod CIDRs for Nodes, with `--allocate-node-cidrs`
/// (the runtime drops it from the enabled controllers otherwise, as Go's start function
/// reports "not enabled"). `allocators` are the vendor's `--cidr-allocator-type`s.
pub(crate) fn node_ipam_controller(allocators: CidrAllocators) -> ControllerEntry {
    ControllerEntry::new(node_ipam::NAME, move |ctx, args| {
        let allocators = allocators.clone();
        async move {
            let config = node_ipam_config(&args.options)?;
            node_ipam::run(ctx, config, &allocators).await
        }
    })
    .alias(node_ipam::ALIAS)
}

/// The node-IPAM controller's configuration from the flags (Go's `startNodeIpamController`).
pub(crate) fn node_ipam_config(o: &Options) -> Result<NodeIpamConfig, ControllerError> {
    let err = |message: String| ControllerError::Config {
        controller: node_ipam::NAME,
        message,
    };
    let cluster_cidrs: Vec<_> = o
        .cluster_cidrs()
        .map_err(|e| err(e.0))?
        .into_iter()
        .map(|n| n.trunc())
        .collect();
    let a = &o.node_ipam;
    let node_mask_sizes = node_ipam::node_mask_sizes(
        &cluster_cidrs,
        a.node_cidr_mask_size,
        a.node_cidr_mask_size_ipv4,
        a.node_cidr_mask_size_ipv6,
    )
    .map_err(err)?;
    Ok(NodeIpamConfig {
        cluster_cidrs,
        node_mask_sizes,
        service_cidrs: o.service_cidrs().map_err(|e| err(e.0))?,
        allocator_type: a.cidr_allocator_type.clone(),
        ..NodeIpamConfig::default()
    })
}

/// Before anything starts: drops the node-IPAM controller from `enabled` without
/// `--allocate-node-cidrs` (Go: "not enabled"), and otherwise checks its flags and
/// `--cidr-allocator-type`, so a bad value stops startup instead of the controller later.
pub(crate) fn check_node_ipam(
    o: &Options,
    enabled: &mut Vec<ControllerEntry>,
    allocators: &CidrAllocators,
) -> Result<(), ControllerError> {
    if !enabled.iter().any(|e| e.name == node_ipam::NAME) {
        return Ok(());
    }
    if !o.generic.allocate_node_cidrs {
        tracing::debug!(
            "not starting {}: --allocate-node-cidrs is false",
            node_ipam::NAME
        );
        enabled.retain(|e| e.name != node_ipam::NAME);
        return Ok(());
    }
    let config = node_ipam_config(o)?;
    allocators.check(&config.allocator_type)?;
    if config.allocator_type == node_ipam::RANGE_ALLOCATOR {
        config.validate()?;
    }
    Ok(())
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
                reconcile_cloud_labels: o.reconcile_cloud_labels(),
            },
        )
        .await
    })
    .alias(ALIAS)
    .client("node-controller")
}

/// `cloud-node-lifecycle-controller` (`cloud-node-lifecycle`): deletes Nodes whose instances
/// are gone (after the grace period), taints shut-down ones.
fn node_lifecycle_controller() -> ControllerEntry {
    use crate::controllers::node_lifecycle::{ALIAS, GoneNodeAction, NAME, NodeLifecycleConfig};
    use crate::options::NodeDeletionMode;
    ControllerEntry::new(NAME, |ctx, args| async move {
        let o = &args.options;
        crate::controllers::node_lifecycle::run(
            ctx,
            NodeLifecycleConfig {
                monitor_period: o.node_monitor_period(),
                deletion_grace_period: o.node_deletion_grace_period(),
                instance_not_found_condition: o.node_instance_not_found_condition(),
                gone_nodes: match o.node_deletion_mode() {
                    NodeDeletionMode::Delete => GoneNodeAction::Delete,
                    NodeDeletionMode::Mark => GoneNodeAction::Mark,
                },
                out_of_service_after: o.node_out_of_service_after(),
                ..NodeLifecycleConfig::default()
            },
        )
        .await
    })
    .alias(ALIAS)
    .client("node-controller")
}

/// `service-lb-controller` (`service`): load balancers for `type: LoadBalancer` Services.
fn service_controller() -> ControllerEntry {
    use crate::controllers::service::{ALIAS, NAME};
    ControllerEntry::new(NAME, |ctx, args| async move {
        crate::controllers::service::run(ctx, service_config(&args.options)?).await
    })
    .alias(ALIAS)
    .client("service-controller")
}

/// The service controller's configuration from the flags; an unreadable
/// `--load-balancer-classes` is a [`ControllerError::Config`] naming it (the runtime checks it
/// at startup, before leader election, with [`crate::controllers::service::check_load_balancer_classes`]).
pub(crate) fn service_config(
    o: &Options,
) -> Result<crate::controllers::service::ServiceConfig, ControllerError> {
    use crate::controllers::service::{NAME, ServedClass, ServiceConfig};
    let load_balancer_classes = o
        .service
        .load_balancer_classes
        .as_deref()
        .map(ServedClass::parse_list)
        .transpose()
        .map_err(|e| ControllerError::Config {
            controller: NAME,
            message: format!("--load-balancer-classes: {e}"),
        })?;
    Ok(ServiceConfig {
        workers: o.service_workers(),
        node_sync_window: o.node_sync_window(),
        node_sync_max_window: o.node_sync_max_window(),
        load_balancer_classes,
        status_conditions: o.service.load_balancer_status_conditions,
    })
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
    .client("route-controller")
}
