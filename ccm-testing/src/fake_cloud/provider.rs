//! The `ccm-core` capability traits implemented by [`FakeCloud`].

use std::sync::Arc;

use async_trait::async_trait;
use ccm_core::{
    CloudError, CloudProvider, CloudResult, Clusters, InitContext, InstanceAnswer, InstanceAnswers,
    InstanceMetadata, Instances, InstancesBatch, InstancesV2, LoadBalancer, LoadBalancerClasses,
    LoadBalancerHostsAnswers, LoadBalancerHostsBatch, LoadBalancerStatus, NodeAddress, NodeView,
    ProviderId, Route, Routes, Service, Zone, Zones,
};

use super::{CallArgs, FakeCloud, State, StoredLoadBalancer, StoredRoute};

/// The node name a Node's instance is registered under: from `spec.providerID` when set,
/// else `metadata.name`.
fn node_instance_name(st: &State, node: &NodeView) -> CloudResult<String> {
    if let Some(pid) = spec_provider_id(node) {
        return name_from_provider_id(st, pid);
    }
    match node.name() {
        "" => Err(CloudError::msg(
            "fake cloud: node has neither spec.providerID nor metadata.name",
        )),
        name => Ok(name.to_owned()),
    }
}

fn spec_provider_id(node: &NodeView) -> Option<&str> {
    Some(node.provider_id()).filter(|p| !p.is_empty())
}

fn node_subject(node: &NodeView) -> String {
    node.name().to_owned()
}

fn node_args(node: &NodeView) -> CallArgs {
    CallArgs::Node {
        name: node_subject(node),
        provider_id: spec_provider_id(node).map(str::to_owned),
    }
}

/// The node name of a provider ID: the Node whose chosen answer has it, else `<name>` of
/// `<provider_name>://<name>`.
fn name_from_provider_id(st: &State, provider_id: &str) -> CloudResult<String> {
    if let Some(name) = st.node_with_provider_id(provider_id) {
        return Ok(name.to_owned());
    }
    let id: ProviderId = provider_id.parse().map_err(CloudError::other)?;
    if id.provider() != st.provider_name {
        return Err(CloudError::msg(format!(
            "fake cloud: provider ID {provider_id:?} belongs to provider {:?}, not {:?}",
            id.provider(),
            st.provider_name
        )));
    }
    Ok(id.instance_id().to_owned())
}

fn service_key(service: &Service) -> CloudResult<String> {
    let name = service
        .metadata
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| CloudError::msg("fake cloud: service has no metadata.name"))?;
    let namespace = service.metadata.namespace.as_deref().unwrap_or("default");
    Ok(format!("{namespace}/{name}"))
}

fn service_subject(service: &Service) -> String {
    service_key(service).unwrap_or_default()
}

/// The names of `hosts`, sorted, each once, as the shared list of `st`.
fn host_names(st: &mut State, hosts: &[NodeView]) -> Arc<[String]> {
    let mut names: Vec<&str> = hosts
        .iter()
        .filter_map(|n| n.name_arc().map(|name| &**name))
        .collect();
    names.sort_unstable();
    names.dedup();
    st.host_sets.intern(&names)
}

#[async_trait]
impl CloudProvider for FakeCloud {
    fn provider_name(&self) -> &str {
        &self.inner.config.provider_name
    }

    async fn initialize(&self, _ctx: InitContext) -> CloudResult<()> {
        self.call("initialize", "", |_| CallArgs::None, |_, _| Ok(()))
            .await
    }

    fn instances_batch(&self) -> Option<&dyn InstancesBatch> {
        self.inner
            .config
            .capabilities
            .instances_batch
            .then_some(self as &dyn InstancesBatch)
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.inner
            .config
            .capabilities
            .instances_v2
            .then_some(self as &dyn InstancesV2)
    }

    fn instances(&self) -> Option<&dyn Instances> {
        self.inner
            .config
            .capabilities
            .instances
            .then_some(self as &dyn Instances)
    }

    fn zones(&self) -> Option<&dyn Zones> {
        self.inner
            .config
            .capabilities
            .zones
            .then_some(self as &dyn Zones)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.inner
            .config
            .capabilities
            .load_balancer
            .then_some(self as &dyn LoadBalancer)
    }

    fn load_balancer_classes(&self) -> LoadBalancerClasses {
        // Checked when the cloud was built (`FakeCloudConfig::validate`).
        self.inner
            .config
            .declared_load_balancer_classes()
            .unwrap_or_default()
    }

    fn load_balancer_ip_modes(&self, class: Option<&str>) -> ccm_core::IpModes {
        // Checked when the cloud was built (`FakeCloudConfig::validate`).
        self.inner
            .config
            .load_balancer_ip_modes_of(class)
            .unwrap_or_default()
    }

    fn load_balancer_hosts_batch(&self) -> Option<&dyn LoadBalancerHostsBatch> {
        let caps = &self.inner.config.capabilities;
        (caps.load_balancer && caps.load_balancer_hosts_batch)
            .then_some(self as &dyn LoadBalancerHostsBatch)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.inner
            .config
            .capabilities
            .routes
            .then_some(self as &dyn Routes)
    }

    fn clusters(&self) -> Option<&dyn Clusters> {
        self.inner
            .config
            .capabilities
            .clusters
            .then_some(self as &dyn Clusters)
    }
}

#[async_trait]
impl InstancesV2 for FakeCloud {
    async fn instance_exists(&self, node: &NodeView) -> CloudResult<bool> {
        let args = |_: &mut State| node_args(node);
        self.call("instance_exists", node_subject(node), args, |_, st| {
            let name = node_instance_name(st, node)?;
            st.node_error(&name)?;
            Ok(!st.is_missing(&name))
        })
        .await
    }

    async fn instance_shutdown(&self, node: &NodeView) -> CloudResult<bool> {
        let args = |_: &mut State| node_args(node);
        self.call("instance_shutdown", node_subject(node), args, |_, st| {
            let name = node_instance_name(st, node)?;
            st.node_error(&name)?;
            Ok(st.is_shutdown(&name))
        })
        .await
    }

    async fn instance_metadata(&self, node: &NodeView) -> CloudResult<InstanceMetadata> {
        let args = |_: &mut State| node_args(node);
        self.call("instance_metadata", node_subject(node), args, |cfg, st| {
            let name = node_instance_name(st, node)?;
            st.metadata(cfg, &name)
        })
        .await
    }
}

#[async_trait]
impl InstancesBatch for FakeCloud {
    fn max_batch_size(&self) -> usize {
        self.inner.config.max_batch_size.max(1)
    }

    async fn describe_instances(&self, nodes: &[NodeView]) -> CloudResult<InstanceAnswers> {
        let max = InstancesBatch::max_batch_size(self);
        let args = |_: &mut State| CallArgs::Nodes(nodes.iter().map(node_subject).collect());
        let subject = format!("{} nodes", nodes.len());
        self.call("describe_instances", subject, args, |cfg, st| {
            if nodes.len() > max {
                return Err(CloudError::msg(format!(
                    "fake cloud: describe_instances got {} nodes, more than max_batch_size {max}",
                    nodes.len()
                )));
            }
            let mut answers = InstanceAnswers::new();
            for node in nodes {
                let answer = match node_instance_name(st, node) {
                    Err(e) => InstanceAnswer::Error(e),
                    Ok(name) => match st.metadata(cfg, &name) {
                        Ok(meta) if st.is_shutdown(&name) => InstanceAnswer::Shutdown(meta),
                        Ok(meta) => InstanceAnswer::Found(meta),
                        Err(CloudError::InstanceNotFound) => InstanceAnswer::NotFound,
                        Err(e) => InstanceAnswer::Error(e),
                    },
                };
                answers.insert(node_subject(node), answer);
            }
            Ok(answers)
        })
        .await
    }
}

#[async_trait]
impl Instances for FakeCloud {
    async fn node_addresses(&self, node_name: &str) -> CloudResult<Vec<NodeAddress>> {
        let args = |_: &mut State| CallArgs::NodeName(node_name.to_owned());
        self.call("node_addresses", node_name, args, |cfg, st| {
            Ok(st.metadata(cfg, node_name)?.node_addresses)
        })
        .await
    }

    async fn node_addresses_by_provider_id(
        &self,
        provider_id: &str,
    ) -> CloudResult<Vec<NodeAddress>> {
        let args = |_: &mut State| CallArgs::ProviderId(provider_id.to_owned());
        self.call(
            "node_addresses_by_provider_id",
            provider_id,
            args,
            |cfg, st| {
                let name = name_from_provider_id(st, provider_id)?;
                Ok(st.metadata(cfg, &name)?.node_addresses)
            },
        )
        .await
    }

    async fn instance_id(&self, node_name: &str) -> CloudResult<String> {
        let args = |_: &mut State| CallArgs::NodeName(node_name.to_owned());
        self.call("instance_id", node_name, args, |cfg, st| {
            // The instance ID is the provider ID without its `<provider>://`.
            let provider_id = st.metadata(cfg, node_name)?.provider_id;
            Ok(provider_id
                .split_once("://")
                .map_or(provider_id.as_str(), |(_, id)| id)
                .to_owned())
        })
        .await
    }

    async fn instance_type(&self, node_name: &str) -> CloudResult<String> {
        let args = |_: &mut State| CallArgs::NodeName(node_name.to_owned());
        self.call("instance_type", node_name, args, |cfg, st| {
            Ok(st.metadata(cfg, node_name)?.instance_type)
        })
        .await
    }

    async fn instance_type_by_provider_id(&self, provider_id: &str) -> CloudResult<String> {
        let args = |_: &mut State| CallArgs::ProviderId(provider_id.to_owned());
        self.call(
            "instance_type_by_provider_id",
            provider_id,
            args,
            |cfg, st| {
                let name = name_from_provider_id(st, provider_id)?;
                Ok(st.metadata(cfg, &name)?.instance_type)
            },
        )
        .await
    }

    async fn add_ssh_key_to_all_instances(&self, user: &str, _key_data: &[u8]) -> CloudResult<()> {
        let args = |_: &mut State| CallArgs::Text(user.to_owned());
        self.call("add_ssh_key_to_all_instances", user, args, |_, _| {
            Err(CloudError::NotImplemented)
        })
        .await
    }

    async fn current_node_name(&self, hostname: &str) -> CloudResult<String> {
        // As Go's fake cloud: the node name is the hostname.
        let args = |_: &mut State| CallArgs::Text(hostname.to_owned());
        self.call("current_node_name", hostname, args, |_, _| {
            Ok(hostname.to_owned())
        })
        .await
    }

    async fn instance_exists_by_provider_id(&self, provider_id: &str) -> CloudResult<bool> {
        let args = |_: &mut State| CallArgs::ProviderId(provider_id.to_owned());
        self.call(
            "instance_exists_by_provider_id",
            provider_id,
            args,
            |_, st| {
                let name = name_from_provider_id(st, provider_id)?;
                st.node_error(&name)?;
                Ok(!st.is_missing(&name))
            },
        )
        .await
    }

    async fn instance_shutdown_by_provider_id(&self, provider_id: &str) -> CloudResult<bool> {
        let args = |_: &mut State| CallArgs::ProviderId(provider_id.to_owned());
        self.call(
            "instance_shutdown_by_provider_id",
            provider_id,
            args,
            |_, st| {
                let name = name_from_provider_id(st, provider_id)?;
                st.node_error(&name)?;
                Ok(st.is_shutdown(&name))
            },
        )
        .await
    }
}

#[async_trait]
impl Zones for FakeCloud {
    async fn get_zone(&self) -> CloudResult<Zone> {
        self.call(
            "get_zone",
            "",
            |_| CallArgs::None,
            |cfg, _| {
                Ok(Zone {
                    failure_domain: cfg.zone.clone(),
                    region: cfg.region.clone(),
                })
            },
        )
        .await
    }

    async fn get_zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Zone> {
        let args = |_: &mut State| CallArgs::ProviderId(provider_id.to_owned());
        self.call("get_zone_by_provider_id", provider_id, args, |cfg, st| {
            let name = name_from_provider_id(st, provider_id)?;
            Ok(zone(st.metadata(cfg, &name)?))
        })
        .await
    }

    async fn get_zone_by_node_name(&self, node_name: &str) -> CloudResult<Zone> {
        let args = |_: &mut State| CallArgs::NodeName(node_name.to_owned());
        self.call("get_zone_by_node_name", node_name, args, |cfg, st| {
            Ok(zone(st.metadata(cfg, node_name)?))
        })
        .await
    }
}

fn zone(meta: InstanceMetadata) -> Zone {
    Zone {
        failure_domain: meta.zone,
        region: meta.region,
    }
}

fn lb_args(
    cluster_name: &str,
    service: &Service,
    hosts: Option<&[NodeView]>,
) -> impl FnOnce(&mut State) -> CallArgs {
    move |st| CallArgs::LoadBalancer {
        cluster_name: cluster_name.to_owned(),
        service: service_subject(service),
        hosts: hosts.map(|hosts| host_names(st, hosts)),
    }
}

#[async_trait]
impl LoadBalancer for FakeCloud {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let args = lb_args(cluster_name, service, None);
        self.call(
            "get_load_balancer",
            service_subject(service),
            args,
            |_, st| {
                let key = service_key(service)?;
                Ok(st
                    .load_balancers
                    .get(&key)
                    .filter(|lb| lb.cluster_name == cluster_name)
                    .map(|lb| self.ingress(lb.ingress_ip)))
            },
        )
        .await
    }

    async fn get_load_balancer_hosts(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<Vec<String>>> {
        let args = lb_args(cluster_name, service, None);
        self.call(
            "get_load_balancer_hosts",
            service_subject(service),
            args,
            |_, st| {
                let key = service_key(service)?;
                Ok(st
                    .load_balancers
                    .get(&key)
                    .filter(|lb| lb.cluster_name == cluster_name)
                    .map(|lb| lb.hosts.to_vec()))
            },
        )
        .await
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerStatus> {
        let args = lb_args(cluster_name, service, Some(hosts));
        self.call(
            "ensure_load_balancer",
            service_subject(service),
            args,
            |_, st| {
                let key = service_key(service)?;
                let ports = service
                    .spec
                    .as_ref()
                    .and_then(|s| s.ports.as_ref())
                    .map(|ports| ports.iter().map(|p| p.port).collect())
                    .unwrap_or_default();
                let ingress_ip = self.ingress_ip_for(st, &key)?;
                let hosts = host_names(st, hosts);
                let new_hosts = hosts.clone();
                let replaced = st.load_balancers.insert(
                    key,
                    StoredLoadBalancer {
                        name: ccm_core::default_load_balancer_name(service),
                        class: service
                            .spec
                            .as_ref()
                            .and_then(|s| s.load_balancer_class.clone()),
                        hosts,
                        ports,
                        cluster_name: cluster_name.to_owned(),
                        ingress_ip,
                    },
                );
                st.host_counts
                    .replace(replaced.as_ref().map(|lb| &lb.hosts), Some(&new_hosts));
                Ok(self.ingress(ingress_ip))
            },
        )
        .await
    }

    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<()> {
        let args = lb_args(cluster_name, service, Some(hosts));
        self.call(
            "update_load_balancer",
            service_subject(service),
            args,
            |_, st| {
                let key = service_key(service)?;
                let exists = st
                    .load_balancers
                    .get(&key)
                    .is_some_and(|lb| lb.cluster_name == cluster_name);
                if !exists {
                    return Err(CloudError::msg(format!(
                        "fake cloud: no load balancer for service {key} in cluster {cluster_name:?}"
                    )));
                }
                let hosts = host_names(st, hosts);
                if let Some(lb) = st.load_balancers.get_mut(&key) {
                    let old = std::mem::replace(&mut lb.hosts, hosts.clone());
                    st.host_counts.replace(Some(&old), Some(&hosts));
                }
                Ok(())
            },
        )
        .await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        let args = lb_args(cluster_name, service, None);
        self.call(
            "ensure_load_balancer_deleted",
            service_subject(service),
            args,
            |_, st| {
                let key = service_key(service)?;
                if st
                    .load_balancers
                    .get(&key)
                    .is_some_and(|lb| lb.cluster_name == cluster_name)
                {
                    // Its ingress IP is free again with it.
                    if let Some(old) = st.load_balancers.remove(&key) {
                        st.host_counts.replace(Some(&old.hosts), None);
                    }
                }
                Ok(())
            },
        )
        .await
    }
}

fn route_args(
    cluster_name: &str,
    name_hint: Option<&str>,
    route: &Route,
) -> impl FnOnce(&mut State) -> CallArgs {
    move |_| CallArgs::Route {
        cluster_name: cluster_name.to_owned(),
        name_hint: name_hint.map(str::to_owned),
        route: route.clone(),
    }
}

#[async_trait]
impl Routes for FakeCloud {
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        let args = |_: &mut State| CallArgs::Cluster(cluster_name.to_owned());
        self.call("list_routes", cluster_name, args, |cfg, st| {
            Ok(st
                .routes
                .values()
                .filter(|r| r.cluster.as_deref().is_none_or(|c| c == cluster_name))
                .map(|r| Route {
                    enable_node_addresses: cfg.track_node_addresses
                        || r.route.enable_node_addresses,
                    ..r.route.clone()
                })
                .collect())
        })
        .await
    }

    async fn create_route(
        &self,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        let args = route_args(cluster_name, Some(name_hint), route);
        self.call(
            "create_route",
            route.destination_cidr.as_str(),
            args,
            |_, st| {
                let base = format!("{cluster_name}-{name_hint}");
                // The route controller passes the Node's UID as the hint for every pod CIDR of the
                // Node (one per family on dual-stack), as Go does: a second CIDR under the same
                // hint gets its own route instead of replacing the first. The route to this CIDR
                // under this hint keeps its name, wherever the other family's route is, so creating
                // it again (after a lost answer) replaces it instead of duplicating it.
                let suffixed = format!(
                    "{base}-{}",
                    route.destination_cidr.replace(['/', ':', '.'], "-")
                );
                let holds_this_cidr = |name: &str| {
                    st.routes
                        .get(name)
                        .is_some_and(|r| r.route.destination_cidr == route.destination_cidr)
                };
                let name = if holds_this_cidr(&suffixed)
                    || (st.routes.contains_key(&base) && !holds_this_cidr(&base))
                {
                    suffixed
                } else {
                    base
                };
                st.routes.insert(
                    name.clone(),
                    StoredRoute {
                        cluster: Some(cluster_name.to_owned()),
                        route: Route {
                            name,
                            enable_node_addresses: false,
                            blackhole: false,
                            ..route.clone()
                        },
                    },
                );
                Ok(())
            },
        )
        .await
    }

    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()> {
        let args = route_args(cluster_name, None, route);
        self.call(
            "delete_route",
            route.destination_cidr.as_str(),
            args,
            |_, st| {
                let visible =
                    |r: &StoredRoute| r.cluster.as_deref().is_none_or(|c| c == cluster_name);
                let key = if route.name.is_empty() {
                    st.routes
                        .iter()
                        .find(|(_, r)| {
                            visible(r)
                                && r.route.destination_cidr == route.destination_cidr
                                && r.route.target_node == route.target_node
                        })
                        .map(|(k, _)| k.clone())
                } else {
                    st.routes
                        .get(&route.name)
                        .filter(|r| visible(r))
                        .map(|_| route.name.clone())
                };
                if let Some(key) = key {
                    st.routes.remove(&key);
                }
                Ok(())
            },
        )
        .await
    }
}

#[async_trait]
impl Clusters for FakeCloud {
    async fn list_clusters(&self) -> CloudResult<Vec<String>> {
        let args = |_: &mut State| CallArgs::None;
        self.call("list_clusters", "", args, |cfg, _| Ok(cfg.clusters.clone()))
            .await
    }

    async fn master(&self, cluster_name: &str) -> CloudResult<String> {
        let args = |_: &mut State| CallArgs::Cluster(cluster_name.to_owned());
        self.call("master", cluster_name, args, |cfg, _| {
            if cfg.clusters.iter().any(|c| c == cluster_name) {
                Ok(format!("https://{cluster_name}.fake.invalid:6443"))
            } else {
                Err(CloudError::msg(format!(
                    "fake cloud: unknown cluster {cluster_name:?}"
                )))
            }
        })
        .await
    }
}

#[async_trait]
impl LoadBalancerHostsBatch for FakeCloud {
    fn max_batch_size(&self) -> usize {
        self.inner.config.max_batch_size.max(1)
    }

    /// Every named load balancer of `cluster_name` gets `hosts`, as `update_load_balancer`
    /// would give it; a Service without one is answered the error `update_load_balancer`
    /// gives, a Service without a name is left out of the answer (not updated).
    async fn update_load_balancer_hosts(
        &self,
        cluster_name: &str,
        services: &[Arc<Service>],
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerHostsAnswers> {
        let max = LoadBalancerHostsBatch::max_batch_size(self);
        let args = |st: &mut State| CallArgs::LoadBalancers {
            cluster_name: cluster_name.to_owned(),
            services: services.iter().map(|s| service_subject(s)).collect(),
            hosts: host_names(st, hosts),
        };
        let subject = format!("{} services", services.len());
        self.call("update_load_balancer_hosts", subject, args, |_, st| {
            if services.len() > max {
                return Err(CloudError::msg(format!(
                    "fake cloud: update_load_balancer_hosts got {} services, more than max_batch_size {max}",
                    services.len()
                )));
            }
            let hosts = host_names(st, hosts);
            let mut answers = LoadBalancerHostsAnswers::new();
            for service in services {
                let Ok(key) = service_key(service) else {
                    continue;
                };
                let answer = match st
                    .load_balancers
                    .get_mut(&key)
                    .filter(|lb| lb.cluster_name == cluster_name)
                {
                    Some(lb) => {
                        let old = std::mem::replace(&mut lb.hosts, hosts.clone());
                        st.host_counts.replace(Some(&old), Some(&hosts));
                        Ok(())
                    }
                    None => Err(CloudError::msg(format!(
                        "fake cloud: no load balancer for service {key} in cluster {cluster_name:?}"
                    ))),
                };
                answers.insert(key, answer);
            }
            Ok(answers)
        })
        .await
    }
}
