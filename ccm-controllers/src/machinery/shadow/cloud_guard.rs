//! The cloud guard: what a shadow answers instead of a mutating provider call. Called by the
//! cloud-call budget (`machinery/budget/provider.rs`) before the call would be made, so a
//! refused call takes no token; the reads it makes go through the budget like any other call.
//!
//! | call | the shadow's answer | reported |
//! |---|---|---|
//! | `ensure_load_balancer` | `get_load_balancer`'s status; an error when none exists | a missing load balancer; hosts that differ |
//! | `update_load_balancer`, the hosts batch | success | hosts that differ |
//! | `ensure_load_balancer_deleted` | success | a load balancer that still exists |
//! | `create_route`, `delete_route` | success | the route (pending for the grace period) |
//!
//! Hosts are compared only when the provider implements the read-only
//! `LoadBalancer::get_load_balancer_hosts` (logged once otherwise).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ccm_core::{
    CloudError, CloudResult, LoadBalancer, LoadBalancerHostsAnswers, LoadBalancerStatus, NodeView,
    Route, Service,
};
use serde_json::{Value, json};

use super::fields::service_pending;
use super::watch::service_object;
use super::{Planned, ROUTE_CONTROLLER, SERVICE_CONTROLLER, Shadow};

/// The field of a missing (or, for a deletion, still existing) load balancer.
pub(crate) const FIELD_LOAD_BALANCER: &str = "loadBalancer";
/// The field of a load balancer's backend hosts.
pub(crate) const FIELD_HOSTS: &str = "loadBalancer.hosts";

fn names(hosts: &[NodeView]) -> BTreeSet<String> {
    hosts
        .iter()
        .filter_map(|n| n.name_arc().map(|name| name.to_string()))
        .collect()
}

fn route_value(route: &Route) -> Value {
    json!({"name": route.name, "targetNode": route.target_node, "destinationCIDR": route.destination_cidr})
}

impl Shadow {
    fn planned_lb(&self, service: &Service, field: &str, incumbent: Value, ours: Value) -> Planned {
        Planned {
            controller: SERVICE_CONTROLLER.to_owned(),
            kind: "Service",
            object: service_object(service),
            field: field.to_owned(),
            also: Vec::new(),
            incumbent,
            ours,
            pending: service_pending(service),
        }
    }

    /// Instead of `ensure_load_balancer`: the existing load balancer's status, its hosts
    /// compared; a missing load balancer is reported and answered with an error (the
    /// controller retries with backoff and writes no status).
    pub(crate) async fn guard_ensure(
        &self,
        lb: &dyn LoadBalancer,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerStatus> {
        self.count_refused("ensure_load_balancer");
        let object = service_object(service);
        match lb.get_load_balancer(cluster_name, service).await? {
            None => {
                self.observe(vec![self.planned_lb(
                    service,
                    FIELD_LOAD_BALANCER,
                    Value::Null,
                    json!("created"),
                )]);
                Err(CloudError::msg(format!(
                    "shadow mode: the load balancer of {object} does not exist and is not created"
                )))
            }
            Some(status) => {
                self.resolve(SERVICE_CONTROLLER, "Service", &object, FIELD_LOAD_BALANCER);
                self.compare_hosts(lb, cluster_name, service, hosts).await?;
                Ok(status)
            }
        }
    }

    /// Instead of `update_load_balancer`: the hosts compared.
    pub(crate) async fn guard_update(
        &self,
        lb: &dyn LoadBalancer,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<()> {
        self.count_refused("update_load_balancer");
        self.compare_hosts(lb, cluster_name, service, hosts).await
    }

    /// Instead of the hosts batch: each Service's hosts compared, one answer each.
    pub(crate) async fn guard_hosts_batch(
        &self,
        lb: &dyn LoadBalancer,
        cluster_name: &str,
        services: &[Arc<Service>],
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerHostsAnswers> {
        self.count_refused("update_load_balancer_hosts");
        let mut answers = LoadBalancerHostsAnswers::new();
        for service in services {
            let result = self.compare_hosts(lb, cluster_name, service, hosts).await;
            answers.insert(service_object(service), result);
        }
        Ok(answers)
    }

    /// Instead of `ensure_load_balancer_deleted`: a load balancer that still exists is
    /// reported; answered with success.
    pub(crate) async fn guard_delete(
        &self,
        lb: &dyn LoadBalancer,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        self.count_refused("ensure_load_balancer_deleted");
        if lb.get_load_balancer(cluster_name, service).await?.is_some() {
            self.observe(vec![self.planned_lb(
                service,
                FIELD_LOAD_BALANCER,
                json!("exists"),
                json!("deleted"),
            )]);
        }
        Ok(())
    }

    /// Compares the hosts the controller would send with the load balancer's
    /// (`get_load_balancer_hosts`), reporting or resolving the difference.
    async fn compare_hosts(
        &self,
        lb: &dyn LoadBalancer,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<()> {
        let current = match lb.get_load_balancer_hosts(cluster_name, service).await {
            Ok(Some(current)) => current.into_iter().collect::<BTreeSet<String>>(),
            // No load balancer: `ensure` reports it.
            Ok(None) => return Ok(()),
            Err(CloudError::NotImplemented) => {
                if !self.hosts_unknown.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        "shadow: the provider does not implement get_load_balancer_hosts; load balancer hosts are not compared"
                    );
                }
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let ours = names(hosts);
        if current == ours {
            self.resolve(
                SERVICE_CONTROLLER,
                "Service",
                &service_object(service),
                FIELD_HOSTS,
            );
        } else {
            self.observe(vec![self.planned_lb(
                service,
                FIELD_HOSTS,
                json!(current),
                json!(ours),
            )]);
        }
        Ok(())
    }

    fn planned_route(&self, route: &Route, incumbent: Value, ours: Value) -> Planned {
        Planned {
            controller: ROUTE_CONTROLLER.to_owned(),
            kind: "Route",
            object: route.destination_cidr.clone(),
            field: "route".to_owned(),
            also: Vec::new(),
            incumbent,
            ours,
            // The incumbent may be creating or deleting it right now.
            pending: true,
        }
    }

    /// Instead of `create_route`: reported (pending for the grace period); success.
    pub(crate) fn guard_create_route(&self, route: &Route) -> CloudResult<()> {
        self.count_refused("create_route");
        self.observe(vec![self.planned_route(
            route,
            Value::Null,
            route_value(route),
        )]);
        Ok(())
    }

    /// Instead of `delete_route`: reported (pending for the grace period); success.
    pub(crate) fn guard_delete_route(&self, route: &Route) -> CloudResult<()> {
        self.count_refused("delete_route");
        self.observe(vec![self.planned_route(
            route,
            route_value(route),
            Value::Null,
        )]);
        Ok(())
    }

    /// After `list_routes`: a reported route change the cloud now shows (the incumbent made
    /// it) is resolved.
    pub(crate) fn routes_listed(&self, routes: &[Route]) {
        let present: BTreeSet<(&str, &str)> = routes
            .iter()
            .map(|r| (r.destination_cidr.as_str(), r.target_node.as_str()))
            .collect();
        let cidrs: BTreeSet<&str> = routes.iter().map(|r| r.destination_cidr.as_str()).collect();
        let done = |incumbent: &Value, ours: &Value| -> bool {
            let field = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
            match (incumbent.is_null(), ours.is_null()) {
                // A creation: done when the route exists.
                (true, false) => {
                    let (Some(cidr), Some(node)) =
                        (field(ours, "destinationCIDR"), field(ours, "targetNode"))
                    else {
                        return false;
                    };
                    present.contains(&(cidr.as_str(), node.as_str()))
                }
                // A deletion: done when no route has its CIDR.
                (false, true) => field(incumbent, "destinationCIDR")
                    .is_some_and(|cidr| !cidrs.contains(cidr.as_str())),
                _ => false,
            }
        };
        let objects: Vec<String> = {
            let state = self.lock();
            let pending = state
                .pending
                .values()
                .map(|(p, _)| p)
                .filter(|p| p.kind == "Route" && done(&p.incumbent, &p.ours))
                .map(|p| p.object.clone());
            let current = state
                .divergences
                .values()
                .filter(|d| d.kind == "Route" && done(&d.incumbent, &d.ours))
                .map(|d| d.object.clone());
            pending.chain(current).collect()
        };
        for object in objects {
            self.settled("Route", &object);
            self.resolve_where("Route", &object, |d| done(&d.incumbent, &d.ours));
        }
    }
}
