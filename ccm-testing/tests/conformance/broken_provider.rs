//! Deliberately broken providers: FakeCloud wrapped to break exactly one contract.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use ccm_core::{
    CloudError, CloudProvider, CloudResult, InstanceMetadata, Instances, InstancesV2, LoadBalancer,
    LoadBalancerStatus, NodeAddress, NodeView, Route, Routes, Service, Zone, Zones, async_trait,
};
use ccm_testing::fake_cloud::FakeCloud;

use crate::support::{SERVICE_KEY, fake};

/// The one contract a [`Broken`] provider breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flaw {
    /// The second `instance_metadata` call for a node answers another instance type.
    MetadataChangesOnce,
    /// `provider_name` is "acme" while provider IDs say `fake://`.
    ProviderNameMismatch,
    /// `provider_id_schemes` declares no scheme.
    NoSchemesDeclared,
    /// `provider_id_schemes` declares a scheme that is no provider name.
    InvalidSchemeDeclared,
    /// `instance_exists` of a missing instance answers InstanceNotFound instead of false.
    ExistsErrorsForUnknown,
    /// `instance_exists` answers false for a shut-down instance.
    ShutDownMeansGone,
    /// `instance_shutdown` always answers false.
    ShutdownNeverReported,
    /// Zones answer an empty region (legacy path only).
    EmptyRegion,
    /// `instance_metadata` answers an additional label whose value no Node can carry.
    InvalidLabelValue,
    /// The legacy v1 instance type disagrees with v2.
    LegacyTypeDiffers,
    /// The legacy `instance_id` invents an ID for a missing instance.
    LegacyIdForUnknown,
    /// `ensure_load_balancer` returns a status without ingress.
    EnsureWithoutIngress,
    /// `get_load_balancer` reports a load balancer that was ever created, even once deleted.
    GetReportsDeleted,
    /// `update_load_balancer` succeeds without changing the hosts.
    UpdateIgnoresHosts,
    /// `ensure_load_balancer_deleted` fails when nothing exists.
    DeleteFailsWhenMissing,
    /// `list_routes` loses the target node.
    ListLosesTargetNode,
    /// `create_route` fails when the route already exists (IPv4 routes only, so that the
    /// dual-stack check, which creates its IPv6 route again, does not see it).
    CreateExistingRouteFails,
    /// `delete_route` fails when the route does not exist.
    DeleteMissingRouteFails,
    /// Routes are keyed by the name hint alone: a second CIDR under the same hint (the other
    /// family of a dual-stack Node) replaces the first.
    RoutesKeyedByHint,
    /// A cancelled `ensure_load_balancer` leaves a load balancer that delete cannot remove.
    CancelLeaksLoadBalancer,
    /// `instance_metadata` keeps the node being looked up in shared state across an await.
    RacyMetadata,
}

pub(crate) struct Broken {
    inner: FakeCloud,
    flaw: Flaw,
    metadata_calls: Mutex<BTreeMap<String, usize>>,
    ever_ensured: Mutex<bool>,
    pending: Mutex<BTreeSet<String>>,
    current: Mutex<Option<NodeView>>,
    by_hint: Mutex<BTreeMap<String, Route>>,
}

impl Broken {
    pub(crate) fn new(flaw: Flaw) -> (Arc<Broken>, FakeCloud) {
        let builder = match flaw {
            // On the legacy-only path, so that only the Zones check sees the flaw.
            Flaw::EmptyRegion => fake().instances_v2(false).legacy_instances(true),
            Flaw::LegacyTypeDiffers | Flaw::LegacyIdForUnknown => fake().legacy_instances(true),
            _ => fake(),
        };
        let inner = builder.build();
        let broken = Broken {
            inner: inner.clone(),
            flaw,
            metadata_calls: Mutex::default(),
            ever_ensured: Mutex::default(),
            pending: Mutex::default(),
            current: Mutex::default(),
            by_hint: Mutex::default(),
        };
        (Arc::new(broken), inner)
    }

    fn is(&self, flaw: Flaw) -> bool {
        self.flaw == flaw
    }
}

fn name(node: &NodeView) -> String {
    node.name().to_owned()
}

#[async_trait]
impl CloudProvider for Broken {
    fn provider_name(&self) -> &str {
        if self.is(Flaw::ProviderNameMismatch) {
            "acme"
        } else {
            self.inner.provider_name()
        }
    }
    fn provider_id_schemes(&self) -> Vec<&str> {
        if self.is(Flaw::NoSchemesDeclared) {
            Vec::new()
        } else if self.is(Flaw::InvalidSchemeDeclared) {
            vec!["fake", "Fake Cloud"]
        } else {
            // The trait's default: `provider_name()` alone.
            vec![self.provider_name()]
        }
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.inner.instances_v2().map(|_| self as &dyn InstancesV2)
    }
    fn instances(&self) -> Option<&dyn Instances> {
        self.inner.instances().map(|_| self as &dyn Instances)
    }
    fn zones(&self) -> Option<&dyn Zones> {
        self.inner.zones().map(|_| self as &dyn Zones)
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.inner
            .load_balancer()
            .map(|_| self as &dyn LoadBalancer)
    }
    fn routes(&self) -> Option<&dyn Routes> {
        CloudProvider::routes(&self.inner).map(|_| self as &dyn Routes)
    }
}

#[async_trait]
impl InstancesV2 for Broken {
    async fn instance_exists(&self, node: &NodeView) -> CloudResult<bool> {
        let exists = InstancesV2::instance_exists(&self.inner, node).await?;
        if self.is(Flaw::ExistsErrorsForUnknown) && !exists {
            return Err(CloudError::InstanceNotFound);
        }
        if self.is(Flaw::ShutDownMeansGone)
            && InstancesV2::instance_shutdown(&self.inner, node).await?
        {
            return Ok(false);
        }
        Ok(exists)
    }

    async fn instance_shutdown(&self, node: &NodeView) -> CloudResult<bool> {
        let shutdown = InstancesV2::instance_shutdown(&self.inner, node).await?;
        Ok(shutdown && !self.is(Flaw::ShutdownNeverReported))
    }

    async fn instance_metadata(&self, node: &NodeView) -> CloudResult<InstanceMetadata> {
        if self.is(Flaw::RacyMetadata) {
            *self.current.lock().unwrap() = Some(node.clone());
            tokio::task::yield_now().await;
            let current = self.current.lock().unwrap().clone().unwrap();
            return InstancesV2::instance_metadata(&self.inner, &current).await;
        }
        let mut meta = InstancesV2::instance_metadata(&self.inner, node).await?;
        if self.is(Flaw::InvalidLabelValue) {
            meta.additional_labels
                .insert("acme.example.com/rack".into(), "rack 7!".into());
        }
        if self.is(Flaw::MetadataChangesOnce) {
            let mut calls = self.metadata_calls.lock().unwrap();
            let count = calls.entry(name(node)).or_default();
            *count += 1;
            if *count == 2 {
                meta.instance_type = "fake-resized".into();
            }
        }
        Ok(meta)
    }
}

#[async_trait]
impl Instances for Broken {
    async fn node_addresses(&self, node_name: &str) -> CloudResult<Vec<NodeAddress>> {
        self.inner.node_addresses(node_name).await
    }
    async fn node_addresses_by_provider_id(&self, pid: &str) -> CloudResult<Vec<NodeAddress>> {
        self.inner.node_addresses_by_provider_id(pid).await
    }
    async fn instance_id(&self, node_name: &str) -> CloudResult<String> {
        match self.inner.instance_id(node_name).await {
            Err(CloudError::InstanceNotFound) if self.is(Flaw::LegacyIdForUnknown) => {
                Ok(node_name.to_owned())
            }
            other => other,
        }
    }
    async fn instance_type(&self, node_name: &str) -> CloudResult<String> {
        self.inner.instance_type(node_name).await
    }
    async fn instance_type_by_provider_id(&self, pid: &str) -> CloudResult<String> {
        let t = self.inner.instance_type_by_provider_id(pid).await?;
        Ok(if self.is(Flaw::LegacyTypeDiffers) {
            "fake-legacy".into()
        } else {
            t
        })
    }
    async fn instance_exists_by_provider_id(&self, pid: &str) -> CloudResult<bool> {
        self.inner.instance_exists_by_provider_id(pid).await
    }
    async fn instance_shutdown_by_provider_id(&self, pid: &str) -> CloudResult<bool> {
        self.inner.instance_shutdown_by_provider_id(pid).await
    }
}

#[async_trait]
impl Zones for Broken {
    async fn get_zone_by_provider_id(&self, pid: &str) -> CloudResult<Zone> {
        let mut zone = self.inner.get_zone_by_provider_id(pid).await?;
        if self.is(Flaw::EmptyRegion) {
            zone.region.clear();
        }
        Ok(zone)
    }
    async fn get_zone_by_node_name(&self, node_name: &str) -> CloudResult<Zone> {
        let mut zone = self.inner.get_zone_by_node_name(node_name).await?;
        if self.is(Flaw::EmptyRegion) {
            zone.region.clear();
        }
        Ok(zone)
    }
}

#[async_trait]
impl LoadBalancer for Broken {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let got = self.inner.get_load_balancer(cluster, svc).await?;
        if self.is(Flaw::GetReportsDeleted) && *self.ever_ensured.lock().unwrap() {
            return Ok(Some(got.unwrap_or_default()));
        }
        if self.is(Flaw::CancelLeaksLoadBalancer) && !self.pending.lock().unwrap().is_empty() {
            return Ok(Some(got.unwrap_or_default()));
        }
        Ok(got)
    }

    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerStatus> {
        if self.is(Flaw::CancelLeaksLoadBalancer) {
            // Allocates a cloud resource, then awaits: dropped here, the resource leaks.
            let id = format!(
                "{}-{}",
                svc.metadata.name.clone().unwrap_or_default(),
                rand_id()
            );
            self.pending.lock().unwrap().insert(id.clone());
            tokio::task::yield_now().await;
            self.pending.lock().unwrap().remove(&id);
        }
        let status = self.inner.ensure_load_balancer(cluster, svc, hosts).await?;
        *self.ever_ensured.lock().unwrap() = true;
        if self.is(Flaw::EnsureWithoutIngress) {
            return Ok(LoadBalancerStatus::default());
        }
        Ok(status)
    }

    async fn update_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<()> {
        if self.is(Flaw::UpdateIgnoresHosts) {
            return Ok(());
        }
        self.inner.update_load_balancer(cluster, svc, hosts).await
    }

    async fn ensure_load_balancer_deleted(&self, cluster: &str, svc: &Service) -> CloudResult<()> {
        if self.is(Flaw::DeleteFailsWhenMissing)
            && !self.inner.load_balancers().contains_key(SERVICE_KEY)
        {
            return Err(CloudError::msg("load balancer not found"));
        }
        self.inner.ensure_load_balancer_deleted(cluster, svc).await
    }
}

fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[async_trait]
impl Routes for Broken {
    async fn list_routes(&self, cluster: &str) -> CloudResult<Vec<Route>> {
        let mut routes = self.inner.list_routes(cluster).await?;
        if self.is(Flaw::ListLosesTargetNode) {
            for r in &mut routes {
                r.target_node.clear();
            }
        }
        Ok(routes)
    }

    async fn create_route(&self, cluster: &str, hint: &str, route: &Route) -> CloudResult<()> {
        if self.is(Flaw::CreateExistingRouteFails)
            && !route.destination_cidr.contains(':')
            && self
                .inner
                .routes()
                .iter()
                .any(|r| r.destination_cidr == route.destination_cidr)
        {
            return Err(CloudError::msg("route already exists"));
        }
        if self.is(Flaw::RoutesKeyedByHint) {
            // One route per hint: the previous route under this hint is overwritten.
            let previous = self.by_hint.lock().unwrap().get(hint).cloned();
            if let Some(previous) = previous
                && previous.destination_cidr != route.destination_cidr
            {
                self.inner.delete_route(cluster, &previous).await?;
            }
            self.by_hint
                .lock()
                .unwrap()
                .insert(hint.to_owned(), route.clone());
        }
        self.inner.create_route(cluster, hint, route).await
    }

    async fn delete_route(&self, cluster: &str, route: &Route) -> CloudResult<()> {
        if self.is(Flaw::DeleteMissingRouteFails)
            && !self
                .inner
                .routes()
                .iter()
                .any(|r| r.destination_cidr == route.destination_cidr)
        {
            return Err(CloudError::msg("route not found"));
        }
        self.inner.delete_route(cluster, route).await
    }
}
