//! [`BudgetedProvider`]: the provider behind the budget, implementing [`CloudProvider`] and
//! every capability trait the inner provider has.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::{
    CloudError, CloudProvider, CloudResult, Clusters, InitContext, InstanceAnswer, InstanceAnswers,
    InstanceMetadata, Instances, InstancesBatch, InstancesV2, LoadBalancer, LoadBalancerClasses,
    LoadBalancerHostsAnswers, LoadBalancerHostsBatch, LoadBalancerStatus, NodeAddress, NodeView,
    Route, Routes, Service, Zone, Zones,
};

use super::call::Budget;
use super::{BudgetConfig, MIN_RETRY_AFTER};
use crate::machinery::metrics::MetricsRegistry;
use crate::machinery::shadow::Shadow;

/// The provider wrapped in the cloud-call budget. Build it once at startup and hand it to every
/// controller (the runtime does this; [`ControllerContext::cloud`](crate::ControllerContext)
/// is one).
pub struct BudgetedProvider {
    inner: Arc<dyn CloudProvider>,
    budget: Arc<Budget>,
    caps: Caps,
}

/// One wrapper per capability, each holding the inner provider and the shared budget.
struct Caps {
    instances_v2: Cap,
    instances: Cap,
    zones: Cap,
    load_balancer: Cap,
    routes: Cap,
    clusters: Cap,
    instances_batch: Cap,
    load_balancer_hosts_batch: Cap,
    /// One load-balancer wrapper (load balancer and hosts batch) per class the provider
    /// declares, by class (`None`: Services without a class), read once when wrapping.
    load_balancers_by_class: Vec<(Option<String>, Cap)>,
}

struct Cap {
    inner: Arc<dyn CloudProvider>,
    budget: Arc<Budget>,
    /// Shadow mode: mutating calls are answered by the cloud guard, never sent.
    shadow: Option<Arc<Shadow>>,
    /// Which load-balancer implementation this wrapper forwards to: `None`, the provider's
    /// `load_balancer()` / `load_balancer_hosts_batch()`; `Some(class)`, its
    /// `load_balancer_for_class(class)` / `load_balancer_hosts_batch_for_class(class)`.
    lb_class: Option<Option<String>>,
}

impl Cap {
    fn lb(&self) -> Option<&dyn LoadBalancer> {
        match &self.lb_class {
            None => self.inner.load_balancer(),
            Some(class) => self.inner.load_balancer_for_class(class.as_deref()),
        }
    }

    fn lb_batch(&self) -> Option<&dyn LoadBalancerHostsBatch> {
        match &self.lb_class {
            None => self.inner.load_balancer_hosts_batch(),
            Some(class) => self
                .inner
                .load_balancer_hosts_batch_for_class(class.as_deref()),
        }
    }
}

impl std::fmt::Debug for BudgetedProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetedProvider")
            .field("provider", &self.inner.provider_name())
            .field("budget", &self.budget)
            .finish()
    }
}

impl BudgetedProvider {
    /// Wraps `inner`, registering the budget's metrics in `metrics`.
    pub fn new(
        inner: Arc<dyn CloudProvider>,
        config: &BudgetConfig,
        metrics: &MetricsRegistry,
    ) -> Arc<Self> {
        Self::with_shadow(inner, config, metrics, None)
    }

    /// Wraps `inner`; with `shadow`, no mutating call is ever sent (shadow mode: the cloud
    /// guard of `machinery/shadow` answers it).
    pub(crate) fn with_shadow(
        inner: Arc<dyn CloudProvider>,
        config: &BudgetConfig,
        metrics: &MetricsRegistry,
        shadow: Option<Arc<Shadow>>,
    ) -> Arc<Self> {
        let budget = Arc::new(Budget::new(config, metrics));
        let cap_for = |lb_class: Option<Option<String>>| Cap {
            inner: inner.clone(),
            budget: budget.clone(),
            shadow: shadow.clone(),
            lb_class,
        };
        let cap = || cap_for(None);
        let load_balancers_by_class = inner
            .load_balancer_classes()
            .entries()
            .map(|class| {
                let class = class.map(str::to_owned);
                (class.clone(), cap_for(Some(class)))
            })
            .collect();
        let caps = Caps {
            instances_v2: cap(),
            instances: cap(),
            zones: cap(),
            load_balancer: cap(),
            routes: cap(),
            clusters: cap(),
            instances_batch: cap(),
            load_balancer_hosts_batch: cap(),
            load_balancers_by_class,
        };
        Arc::new(BudgetedProvider {
            inner,
            budget,
            caps,
        })
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &Arc<dyn CloudProvider> {
        &self.inner
    }

    /// Cloud calls currently in flight (including those waiting for a token).
    pub fn in_flight(&self) -> usize {
        *self.budget.in_flight.borrow()
    }

    /// Cloud calls waiting for the budget now (not sent yet): the budget is saturated.
    pub(crate) fn waiting_for_budget(&self) -> usize {
        self.budget.waiting()
    }

    /// Waits until no cloud call is in flight, or `deadline` passes. True if idle.
    pub async fn wait_idle(&self, deadline: Duration) -> bool {
        let mut rx = self.budget.in_flight.subscribe();
        tokio::time::timeout(deadline, rx.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

fn missing() -> CloudError {
    // Unreachable through the capability accessors (they return None when the inner provider
    // lacks the capability); kept total instead of panicking.
    CloudError::NotImplemented
}

#[async_trait]
impl CloudProvider for BudgetedProvider {
    fn provider_name(&self) -> &str {
        self.inner.provider_name()
    }

    fn provider_id_schemes(&self) -> Vec<&str> {
        self.inner.provider_id_schemes()
    }

    fn has_cluster_id(&self) -> bool {
        self.inner.has_cluster_id()
    }

    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        self.budget
            .call("initialize", self.inner.initialize(ctx))
            .await
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.inner
            .instances_v2()
            .map(|_| &self.caps.instances_v2 as &dyn InstancesV2)
    }

    fn instances(&self) -> Option<&dyn Instances> {
        self.inner
            .instances()
            .map(|_| &self.caps.instances as &dyn Instances)
    }

    fn zones(&self) -> Option<&dyn Zones> {
        self.inner.zones().map(|_| &self.caps.zones as &dyn Zones)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.inner
            .load_balancer()
            .map(|_| &self.caps.load_balancer as &dyn LoadBalancer)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.inner
            .routes()
            .map(|_| &self.caps.routes as &dyn Routes)
    }

    fn clusters(&self) -> Option<&dyn Clusters> {
        self.inner
            .clusters()
            .map(|_| &self.caps.clusters as &dyn Clusters)
    }

    fn instances_batch(&self) -> Option<&dyn InstancesBatch> {
        self.inner
            .instances_batch()
            .map(|_| &self.caps.instances_batch as &dyn InstancesBatch)
    }

    fn load_balancer_hosts_batch(&self) -> Option<&dyn LoadBalancerHostsBatch> {
        self.inner
            .load_balancer_hosts_batch()
            .map(|_| &self.caps.load_balancer_hosts_batch as &dyn LoadBalancerHostsBatch)
    }

    fn load_balancer_classes(&self) -> LoadBalancerClasses {
        self.inner.load_balancer_classes()
    }

    fn load_balancer_ip_modes(&self, class: Option<&str>) -> ccm_core::IpModes {
        self.inner.load_balancer_ip_modes(class)
    }

    fn load_balancer_for_class(&self, class: Option<&str>) -> Option<&dyn LoadBalancer> {
        let cap = self.class_cap(class)?;
        cap.lb().map(|_| cap as &dyn LoadBalancer)
    }

    fn load_balancer_hosts_batch_for_class(
        &self,
        class: Option<&str>,
    ) -> Option<&dyn LoadBalancerHostsBatch> {
        let cap = self.class_cap(class)?;
        cap.lb_batch().map(|_| cap as &dyn LoadBalancerHostsBatch)
    }
}

impl BudgetedProvider {
    /// The wrapper of a declared class's load-balancer implementation (`None` for a class the
    /// provider did not declare).
    fn class_cap(&self, class: Option<&str>) -> Option<&Cap> {
        self.caps
            .load_balancers_by_class
            .iter()
            .find(|(c, _)| c.as_deref() == class)
            .map(|(_, cap)| cap)
    }
}

/// Forwards one capability method through the budget.
macro_rules! budgeted {
    ($self:ident, $cap:ident, $op:ident ( $($arg:expr),* )) => {
        budgeted!(@from $self, $self.inner.$cap(), $op($($arg),*))
    };
    (@from $self:ident, $found:expr, $op:ident ( $($arg:expr),* )) => {
        $self
            .budget
            .call(stringify!($op), async {
                match $found {
                    Some(c) => c.$op($($arg),*).await,
                    None => Err(missing()),
                }
            })
            .await
    };
}

#[async_trait]
impl InstancesV2 for Cap {
    async fn instance_exists(&self, node: &NodeView) -> CloudResult<bool> {
        budgeted!(self, instances_v2, instance_exists(node))
    }
    async fn instance_shutdown(&self, node: &NodeView) -> CloudResult<bool> {
        budgeted!(self, instances_v2, instance_shutdown(node))
    }
    async fn instance_metadata(&self, node: &NodeView) -> CloudResult<InstanceMetadata> {
        budgeted!(self, instances_v2, instance_metadata(node))
    }
}

#[async_trait]
impl Instances for Cap {
    async fn node_addresses(&self, node_name: &str) -> CloudResult<Vec<NodeAddress>> {
        budgeted!(self, instances, node_addresses(node_name))
    }
    async fn node_addresses_by_provider_id(
        &self,
        provider_id: &str,
    ) -> CloudResult<Vec<NodeAddress>> {
        budgeted!(self, instances, node_addresses_by_provider_id(provider_id))
    }
    async fn instance_id(&self, node_name: &str) -> CloudResult<String> {
        budgeted!(self, instances, instance_id(node_name))
    }
    async fn instance_type(&self, node_name: &str) -> CloudResult<String> {
        budgeted!(self, instances, instance_type(node_name))
    }
    async fn instance_type_by_provider_id(&self, provider_id: &str) -> CloudResult<String> {
        budgeted!(self, instances, instance_type_by_provider_id(provider_id))
    }
    async fn add_ssh_key_to_all_instances(&self, user: &str, key_data: &[u8]) -> CloudResult<()> {
        if self.shadow.is_some() {
            return Err(CloudError::msg(
                "shadow mode: add_ssh_key_to_all_instances is not sent",
            ));
        }
        budgeted!(
            self,
            instances,
            add_ssh_key_to_all_instances(user, key_data)
        )
    }
    async fn current_node_name(&self, hostname: &str) -> CloudResult<String> {
        budgeted!(self, instances, current_node_name(hostname))
    }
    async fn instance_exists_by_provider_id(&self, provider_id: &str) -> CloudResult<bool> {
        budgeted!(self, instances, instance_exists_by_provider_id(provider_id))
    }
    async fn instance_shutdown_by_provider_id(&self, provider_id: &str) -> CloudResult<bool> {
        budgeted!(
            self,
            instances,
            instance_shutdown_by_provider_id(provider_id)
        )
    }
}

#[async_trait]
impl Zones for Cap {
    async fn get_zone(&self) -> CloudResult<Zone> {
        budgeted!(self, zones, get_zone())
    }
    async fn get_zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Zone> {
        budgeted!(self, zones, get_zone_by_provider_id(provider_id))
    }
    async fn get_zone_by_node_name(&self, node_name: &str) -> CloudResult<Zone> {
        budgeted!(self, zones, get_zone_by_node_name(node_name))
    }
}

#[async_trait]
impl LoadBalancer for Cap {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        budgeted!(
            @from self,
            self.lb(),
            get_load_balancer(cluster_name, service)
        )
    }
    fn get_load_balancer_name(&self, cluster_name: &str, service: &Service) -> String {
        // Local and synchronous: no cloud call, so no budget.
        match self.lb() {
            Some(lb) => lb.get_load_balancer_name(cluster_name, service),
            None => ccm_core::default_load_balancer_name(service),
        }
    }
    async fn get_load_balancer_hosts(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<Vec<String>>> {
        budgeted!(
            @from self,
            self.lb(),
            get_load_balancer_hosts(cluster_name, service)
        )
    }
    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerStatus> {
        if let Some(shadow) = &self.shadow {
            return shadow
                .guard_ensure(self, cluster_name, service, hosts)
                .await;
        }
        budgeted!(
            @from self,
            self.lb(),
            ensure_load_balancer(cluster_name, service, hosts)
        )
    }
    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<()> {
        if let Some(shadow) = &self.shadow {
            return shadow
                .guard_update(self, cluster_name, service, hosts)
                .await;
        }
        budgeted!(
            @from self,
            self.lb(),
            update_load_balancer(cluster_name, service, hosts)
        )
    }
    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        if let Some(shadow) = &self.shadow {
            return shadow.guard_delete(self, cluster_name, service).await;
        }
        budgeted!(
            @from self,
            self.lb(),
            ensure_load_balancer_deleted(cluster_name, service)
        )
    }
}

#[async_trait]
impl Routes for Cap {
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        let routes = budgeted!(self, routes, list_routes(cluster_name))?;
        if let Some(shadow) = &self.shadow {
            shadow.routes_listed(&routes);
        }
        Ok(routes)
    }
    async fn create_route(
        &self,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        if let Some(shadow) = &self.shadow {
            return shadow.guard_create_route(route);
        }
        budgeted!(self, routes, create_route(cluster_name, name_hint, route))
    }
    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()> {
        if let Some(shadow) = &self.shadow {
            return shadow.guard_delete_route(route);
        }
        budgeted!(self, routes, delete_route(cluster_name, route))
    }
}

#[async_trait]
impl Clusters for Cap {
    async fn list_clusters(&self) -> CloudResult<Vec<String>> {
        budgeted!(self, clusters, list_clusters())
    }
    async fn master(&self, cluster_name: &str) -> CloudResult<String> {
        budgeted!(self, clusters, master(cluster_name))
    }
}

#[async_trait]
impl InstancesBatch for Cap {
    fn max_batch_size(&self) -> usize {
        // Local and synchronous: no cloud call, so no budget.
        self.inner
            .instances_batch()
            .map_or(1, |b| b.max_batch_size().max(1))
    }
    async fn describe_instances(&self, nodes: &[NodeView]) -> CloudResult<InstanceAnswers> {
        let mut answers = budgeted!(self, instances_batch, describe_instances(nodes))?;
        // A per-Node Retry is raised to the same floor as a Retry of a whole call.
        for answer in answers.values_mut() {
            if let InstanceAnswer::Error(CloudError::Retry { after, .. }) = answer
                && *after < MIN_RETRY_AFTER
            {
                *after = MIN_RETRY_AFTER;
            }
        }
        Ok(answers)
    }
}

#[async_trait]
impl LoadBalancerHostsBatch for Cap {
    fn max_batch_size(&self) -> usize {
        // Local and synchronous: no cloud call, so no budget.
        self.lb_batch().map_or(1, |b| b.max_batch_size().max(1))
    }
    async fn update_load_balancer_hosts(
        &self,
        cluster_name: &str,
        services: &[Arc<Service>],
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerHostsAnswers> {
        if let Some(shadow) = &self.shadow {
            return shadow
                .guard_hosts_batch(self, cluster_name, services, hosts)
                .await;
        }
        let mut answers = budgeted!(
            @from self,
            self.lb_batch(),
            update_load_balancer_hosts(cluster_name, services, hosts)
        )?;
        // A per-Service Retry is raised to the same floor as a Retry of a whole call.
        for answer in answers.values_mut() {
            if let Err(CloudError::Retry { after, .. }) = answer
                && *after < MIN_RETRY_AFTER
            {
                *after = MIN_RETRY_AFTER;
            }
        }
        Ok(answers)
    }
}
