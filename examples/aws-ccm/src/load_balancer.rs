//! `LoadBalancer` and `LoadBalancerHostsBatch` as ELBv2 network load balancers, in two kinds.
//!
//! Per Service: one NLB named `a<uid without dashes>` (32 characters at most, the name the
//! AWS cloud provider uses), one target group and one TCP/UDP listener per Service port
//! ([`crate::target_groups`]), NodePort targets for every host. Everything is tagged with the
//! cluster tag `kubernetes.io/cluster/<cluster>` = `owned`, the Service
//! (`kubernetes.io/service-name` = `<namespace>/<name>`) and, on target groups, the load
//! balancer's name; deletion removes exactly what carries those tags. A load balancer still
//! `provisioning` answers `CloudError::Retry`: its status (the DNS name as ingress hostname)
//! is written once it is `active`.
//!
//! [`NetworkLoadBalancers`] is the implementation of one load-balancer class: Services without
//! a class get NLBs of the configured scheme in `subnets`, Services of class
//! [`INTERNAL_NLB_CLASS`] internal NLBs in `internalSubnets`. The two differ in the scheme and
//! the subnets only; everything else is this module's code, shared.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Listener, LoadBalancerSchemeEnum, LoadBalancerStateEnum,
    LoadBalancerTypeEnum, Tag,
};
use ccm_core::{
    CloudError, CloudResult, LoadBalancer, LoadBalancerHostsAnswers, LoadBalancerHostsBatch,
    LoadBalancerIngress, LoadBalancerStatus, NodeView, Service, async_trait,
    default_load_balancer_name,
};
use futures::StreamExt;
use tracing::{info, warn};

use crate::CallCounts;
use crate::errors::{code, to_cloud_error};
use crate::instances::instance_id_from_provider_id;
use crate::target_groups::{PortSpec, tag};

/// The load-balancer class of internal network load balancers: a Service with this
/// `spec.loadBalancerClass` gets an NLB of scheme `internal` (private IP addresses only) in the
/// cloud-config's `internalSubnets`. Under the example's own domain: `service.k8s.aws/nlb` is
/// the AWS Load Balancer Controller's and `eks.amazonaws.com/nlb` EKS Auto Mode's.
pub const INTERNAL_NLB_CLASS: &str = "aws-ccm.ccm-rs.io/internal-nlb";

/// The tag naming the Service that owns a load balancer or target group.
pub const SERVICE_TAG: &str = "kubernetes.io/service-name";
/// The tag naming, on a target group, the load balancer it was created for.
pub const LB_NAME_TAG: &str = "aws-ccm.ccm-rs.io/load-balancer-name";
/// The most load balancer names one `DescribeLoadBalancers` call accepts.
const NAMES_PER_CALL: usize = 20;
/// How many load balancers one hosts batch updates at the same time.
pub const UPDATE_CONCURRENCY: usize = 10;

/// The cluster tag key, as the AWS cloud provider writes it.
pub fn cluster_tag_key(cluster: &str) -> String {
    format!("kubernetes.io/cluster/{cluster}")
}

/// Who owns a load balancer: the cluster, the Service and the load balancer's name.
#[derive(Clone, Debug)]
pub(crate) struct Owner {
    pub(crate) cluster: String,
    pub(crate) service: String,
    pub(crate) lb_name: String,
}

impl Owner {
    fn new(cluster: &str, service: &Service) -> Owner {
        let namespace = service.metadata.namespace.as_deref().unwrap_or("default");
        let name = service.metadata.name.as_deref().unwrap_or_default();
        Owner {
            cluster: cluster.to_owned(),
            service: format!("{namespace}/{name}"),
            lb_name: default_load_balancer_name(service),
        }
    }

    pub(crate) fn tags(&self) -> Vec<Tag> {
        vec![
            tag(&cluster_tag_key(&self.cluster), "owned"),
            tag(SERVICE_TAG, &self.service),
            tag(LB_NAME_TAG, &self.lb_name),
        ]
    }

    fn owns(&self, tags: &[Tag]) -> bool {
        let has = |k: &str, v: &str| {
            tags.iter()
                .any(|t| t.key() == Some(k) && t.value() == Some(v))
        };
        tags.iter()
            .any(|t| t.key() == Some(cluster_tag_key(&self.cluster).as_str()))
            && has(SERVICE_TAG, &self.service)
    }
}

/// One lock per load balancer name: two workers (or a cancelled call and its retry) never
/// reconcile the same load balancer at once, which would create its parts twice.
#[derive(Debug, Default)]
pub(crate) struct Locks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl Locks {
    fn get(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(name.to_owned()).or_default().clone()
    }
}

fn port_specs(service: &Service) -> CloudResult<Vec<PortSpec>> {
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
    let mut specs = Vec::new();
    for port in ports.into_iter().flatten() {
        let protocol = port.protocol.as_deref().unwrap_or("TCP").to_owned();
        if protocol != "TCP" && protocol != "UDP" {
            return Err(CloudError::msg(format!(
                "port {} uses {protocol}: a network load balancer takes TCP and UDP only",
                port.port
            )));
        }
        let node_port = port.node_port.unwrap_or(0);
        if node_port == 0 {
            return Err(CloudError::msg(format!(
                "port {} has no nodePort: the load balancer targets NodePorts (allocateLoadBalancerNodePorts must not be false)",
                port.port
            )));
        }
        specs.push(PortSpec {
            port: port.port,
            node_port,
            protocol,
        });
    }
    if specs.is_empty() {
        return Err(CloudError::msg("the Service has no ports"));
    }
    Ok(specs)
}

/// The instance IDs of the hosts (Nodes without an AWS provider ID are skipped).
fn host_instances(hosts: &[NodeView]) -> BTreeSet<String> {
    hosts
        .iter()
        .filter_map(|n| instance_id_from_provider_id(n.provider_id()))
        .map(str::to_owned)
        .collect()
}

type ElbLoadBalancer = aws_sdk_elasticloadbalancingv2::types::LoadBalancer;

/// The network load balancers of one load-balancer class: the `LoadBalancer` and
/// `LoadBalancerHostsBatch` implementation that [`AwsCloud`](crate::AwsCloud) returns for it.
/// Kinds differ in their scheme and subnets; they share the SDK client, the per-name locks
/// (a load balancer's name comes from the Service's UID, whatever its class) and the call
/// counts.
#[derive(Debug)]
pub struct NetworkLoadBalancers {
    class: Option<&'static str>,
    scheme: LoadBalancerSchemeEnum,
    subnets: Vec<String>,
    pub(crate) vpc: String,
    provisioning_retry: Duration,
    pub(crate) elb: aws_sdk_elasticloadbalancingv2::Client,
    locks: Arc<Locks>,
    calls: CallCounts,
}

/// What makes one kind of network load balancer: the class it serves (`None`: Services
/// without a class), its scheme and its subnets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NlbKind {
    /// The declared load-balancer class; `None`: Services without a class.
    pub(crate) class: Option<&'static str>,
    /// `internet-facing` or `internal`.
    pub(crate) scheme: LoadBalancerSchemeEnum,
    /// The subnets the load balancers are placed in (at least one).
    pub(crate) subnets: Vec<String>,
}

impl NetworkLoadBalancers {
    pub(crate) fn new(
        kind: NlbKind,
        config: &crate::AwsConfig,
        elb: aws_sdk_elasticloadbalancingv2::Client,
        locks: Arc<Locks>,
        calls: CallCounts,
    ) -> NetworkLoadBalancers {
        NetworkLoadBalancers {
            class: kind.class,
            scheme: kind.scheme,
            subnets: kind.subnets,
            vpc: config.vpc.clone(),
            provisioning_retry: config.provisioning_retry(),
            elb,
            locks,
            calls,
        }
    }

    /// The load-balancer class served (`None`: Services without a class).
    pub fn class(&self) -> Option<&'static str> {
        self.class
    }

    /// The scheme of the load balancers created.
    pub fn scheme(&self) -> &LoadBalancerSchemeEnum {
        &self.scheme
    }

    /// What these load balancers are for, in messages: "Services without a class" or
    /// "Services of class ...".
    fn served(&self) -> String {
        match self.class {
            None => "Services without a class".to_owned(),
            Some(class) => format!("Services of class {class}"),
        }
    }

    /// The load balancer called `name`, if any.
    async fn find_load_balancer(&self, name: &str) -> CloudResult<Option<ElbLoadBalancer>> {
        match self.elb.describe_load_balancers().names(name).send().await {
            Ok(out) => Ok(out.load_balancers().first().cloned()),
            Err(e) if code(&e) == Some("LoadBalancerNotFound") => Ok(None),
            Err(e) => Err(to_cloud_error("DescribeLoadBalancers", e)),
        }
    }

    async fn tags_of(&self, arn: &str) -> CloudResult<Vec<Tag>> {
        let out = self
            .elb
            .describe_tags()
            .resource_arns(arn)
            .send()
            .await
            .map_err(|e| to_cloud_error("DescribeTags", e))?;
        Ok(out
            .tag_descriptions()
            .iter()
            .flat_map(|d| d.tags().iter().cloned())
            .collect())
    }

    async fn listeners(&self, lb_arn: &str) -> CloudResult<Vec<Listener>> {
        let out = self
            .elb
            .describe_listeners()
            .load_balancer_arn(lb_arn)
            .send()
            .await
            .map_err(|e| to_cloud_error("DescribeListeners", e))?;
        Ok(out.listeners().to_vec())
    }

    fn status(lb: &ElbLoadBalancer) -> LoadBalancerStatus {
        LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                hostname: lb.dns_name().map(str::to_owned),
                ..Default::default()
            }]),
        }
    }

    async fn ensure(
        &self,
        owner: &Owner,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerStatus> {
        let specs = port_specs(service)?;
        let lb = match self.find_load_balancer(&owner.lb_name).await? {
            Some(lb) => {
                let arn = lb.load_balancer_arn().unwrap_or_default();
                if !owner.owns(&self.tags_of(arn).await?) {
                    return Err(CloudError::msg(format!(
                        "a load balancer named {} exists but is not tagged as {}'s in cluster {}: not touching it",
                        owner.lb_name, owner.service, owner.cluster
                    )));
                }
                self.check_scheme(owner, &lb)?;
                lb
            }
            None => self.create_load_balancer(owner).await?,
        };
        let lb_arn = lb.load_balancer_arn().unwrap_or_default().to_owned();
        let instances = host_instances(hosts);

        let mut listeners: BTreeMap<i32, Listener> = self
            .listeners(&lb_arn)
            .await?
            .into_iter()
            .filter_map(|l| Some((l.port()?, l)))
            .collect();
        let mut keep_groups = BTreeSet::new();
        let mut repointed = false;
        for spec in &specs {
            let group = self.ensure_target_group(owner, spec).await?;
            let group_arn = group.target_group_arn().unwrap_or_default().to_owned();
            self.reconcile_targets(&group_arn, &instances).await?;
            keep_groups.insert(group_arn.clone());
            let action = Action::builder()
                .r#type(ActionTypeEnum::Forward)
                .target_group_arn(&group_arn)
                .build();
            match listeners.remove(&spec.port) {
                None => {
                    self.elb
                        .create_listener()
                        .load_balancer_arn(&lb_arn)
                        .port(spec.port)
                        .protocol(spec.protocol_enum())
                        .default_actions(action)
                        .send()
                        .await
                        .map_err(|e| to_cloud_error("CreateListener", e))?;
                }
                Some(listener) => {
                    let forwards_to = listener
                        .default_actions()
                        .iter()
                        .filter_map(|a| a.target_group_arn())
                        .collect::<Vec<_>>();
                    let same = forwards_to == [group_arn.as_str()]
                        && listener.protocol() == Some(&spec.protocol_enum());
                    if !same {
                        repointed = true;
                        self.elb
                            .modify_listener()
                            .listener_arn(listener.listener_arn().unwrap_or_default())
                            .protocol(spec.protocol_enum())
                            .default_actions(action)
                            .send()
                            .await
                            .map_err(|e| to_cloud_error("ModifyListener", e))?;
                    }
                }
            }
        }
        // Listeners of ports the Service no longer has, then target groups nothing uses.
        for listener in listeners.values() {
            repointed = true;
            match self
                .elb
                .delete_listener()
                .listener_arn(listener.listener_arn().unwrap_or_default())
                .send()
                .await
            {
                Ok(_) => {}
                Err(e) if code(&e) == Some("ListenerNotFound") => {}
                Err(e) => return Err(to_cloud_error("DeleteListener", e)),
            }
        }
        if repointed {
            for arn in self
                .owned_target_groups(&owner.cluster, Some(&owner.lb_name))
                .await?
            {
                if !keep_groups.contains(&arn) {
                    self.delete_target_group(&arn).await?;
                }
            }
        }

        let state = lb.state().and_then(|s| s.code());
        let lb = if state == Some(&LoadBalancerStateEnum::Active) {
            lb
        } else {
            // Created (or last seen) provisioning: ask again for the current state.
            self.find_load_balancer(&owner.lb_name).await?.unwrap_or(lb)
        };
        match lb.state().and_then(|s| s.code()) {
            Some(LoadBalancerStateEnum::Active) => Ok(Self::status(&lb)),
            Some(LoadBalancerStateEnum::Provisioning) | None => Err(CloudError::retry(
                self.provisioning_retry,
                format!("load balancer {} is still provisioning", owner.lb_name),
            )),
            Some(other) => Err(CloudError::msg(format!(
                "load balancer {} is in state {}",
                owner.lb_name,
                other.as_str()
            ))),
        }
    }

    /// An existing load balancer of another scheme is an error, never used: AWS cannot change
    /// the scheme of a load balancer, and an internet-facing one for a Service that asked for
    /// an internal one would expose it. (The AWS cloud provider leaves a "TODO: Sync internal
    /// vs non-internal" here and keeps the load balancer it finds.)
    fn check_scheme(&self, owner: &Owner, lb: &ElbLoadBalancer) -> CloudResult<()> {
        match lb.scheme() {
            Some(scheme) if *scheme != self.scheme => Err(CloudError::msg(format!(
                "load balancer {} of {} is {}, but {} get {} load balancers here, and AWS cannot change the scheme of a load balancer: not using it (delete and recreate the Service for a new load balancer, or restore the cloud-config or --load-balancer-classes that created it)",
                owner.lb_name,
                owner.service,
                scheme.as_str(),
                self.served(),
                self.scheme.as_str()
            ))),
            _ => Ok(()),
        }
    }

    async fn create_load_balancer(&self, owner: &Owner) -> CloudResult<ElbLoadBalancer> {
        let out = self
            .elb
            .create_load_balancer()
            .name(&owner.lb_name)
            .r#type(LoadBalancerTypeEnum::Network)
            .scheme(self.scheme.clone())
            .set_subnets(Some(self.subnets.clone()))
            .set_tags(Some(owner.tags()))
            .send()
            .await
            .map_err(|e| to_cloud_error("CreateLoadBalancer", e))?;
        info!(load_balancer = %owner.lb_name, service = %owner.service,
            scheme = self.scheme.as_str(), class = self.class.unwrap_or("-"),
            "created network load balancer");
        out.load_balancers()
            .first()
            .cloned()
            .ok_or_else(|| CloudError::msg("CreateLoadBalancer answered no load balancer"))
    }

    /// Sets the targets of every target group the load balancer's listeners forward to.
    async fn update_hosts(
        &self,
        lb: &ElbLoadBalancer,
        instances: &BTreeSet<String>,
    ) -> CloudResult<()> {
        let listeners = self
            .listeners(lb.load_balancer_arn().unwrap_or_default())
            .await?;
        for listener in &listeners {
            for group in listener
                .default_actions()
                .iter()
                .filter_map(|a| a.target_group_arn())
            {
                self.reconcile_targets(group, instances).await?;
            }
        }
        Ok(())
    }

    async fn delete(&self, owner: &Owner) -> CloudResult<()> {
        if let Some(lb) = self.find_load_balancer(&owner.lb_name).await? {
            let arn = lb.load_balancer_arn().unwrap_or_default().to_owned();
            if owner.owns(&self.tags_of(&arn).await?) {
                match self
                    .elb
                    .delete_load_balancer()
                    .load_balancer_arn(&arn)
                    .send()
                    .await
                {
                    Ok(_) => info!(load_balancer = %owner.lb_name, "deleted network load balancer"),
                    Err(e) if code(&e) == Some("LoadBalancerNotFound") => {}
                    Err(e) => return Err(to_cloud_error("DeleteLoadBalancer", e)),
                }
            } else {
                warn!(load_balancer = %owner.lb_name, service = %owner.service,
                    "a load balancer of this name is not tagged as the Service's: left alone");
            }
        }
        // Thorough: the target groups by tag, also those a listener never pointed to (an
        // ensure cancelled half-way).
        for arn in self
            .owned_target_groups(&owner.cluster, Some(&owner.lb_name))
            .await?
        {
            self.delete_target_group(&arn).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl LoadBalancer for NetworkLoadBalancers {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.calls.count("get_load_balancer");
        let owner = Owner::new(cluster_name, service);
        match self.find_load_balancer(&owner.lb_name).await? {
            Some(lb)
                if owner.owns(
                    &self
                        .tags_of(lb.load_balancer_arn().unwrap_or_default())
                        .await?,
                ) =>
            {
                Ok(Some(Self::status(&lb)))
            }
            Some(_) => Ok(None),
            // What the real API taught: the service controller (as Go's) calls
            // `ensure_load_balancer_deleted` only when this answers "exists". A delete that
            // stopped half-way (the load balancer gone, a target group still in use, a 5xx)
            // must therefore keep answering "exists" while its target groups linger, or they
            // are never deleted.
            None => {
                let lingering = self
                    .owned_target_groups(&owner.cluster, Some(&owner.lb_name))
                    .await?;
                Ok((!lingering.is_empty()).then(LoadBalancerStatus::default))
            }
        }
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerStatus> {
        self.calls.count("ensure_load_balancer");
        let owner = Owner::new(cluster_name, service);
        let lock = self.locks.get(&owner.lb_name);
        let _guard = lock.lock().await;
        self.ensure(&owner, service, hosts).await
    }

    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<()> {
        self.calls.count("update_load_balancer");
        let owner = Owner::new(cluster_name, service);
        let lock = self.locks.get(&owner.lb_name);
        let _guard = lock.lock().await;
        let lb = self
            .find_load_balancer(&owner.lb_name)
            .await?
            .ok_or_else(|| {
                CloudError::msg(format!("load balancer {} does not exist", owner.lb_name))
            })?;
        self.update_hosts(&lb, &host_instances(hosts)).await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        self.calls.count("ensure_load_balancer_deleted");
        let owner = Owner::new(cluster_name, service);
        let lock = self.locks.get(&owner.lb_name);
        let _guard = lock.lock().await;
        self.delete(&owner).await
    }
}

/// The hosts of many load balancers in one framework call: one `DescribeLoadBalancers` per 20
/// Services instead of one per Service, then the target diffs of each, [`UPDATE_CONCURRENCY`]
/// at a time.
///
/// What the real API taught: ELBv2 has no call that changes many target groups, so a batch of
/// 100 Services is some 700 requests; one after the other they outlast the framework's
/// per-call timeout (`--cloud-api-timeout`), which cancels the whole batch and falls back to
/// single updates. They run concurrently instead.
#[async_trait]
impl LoadBalancerHostsBatch for NetworkLoadBalancers {
    fn max_batch_size(&self) -> usize {
        100
    }

    async fn update_load_balancer_hosts(
        &self,
        cluster_name: &str,
        services: &[Arc<Service>],
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerHostsAnswers> {
        self.calls.count("update_load_balancer_hosts");
        let instances = host_instances(hosts);
        let owners: Vec<Owner> = services
            .iter()
            .map(|s| Owner::new(cluster_name, s))
            .collect();
        let mut found = Vec::new();
        for chunk in owners.chunks(NAMES_PER_CALL) {
            let names: Vec<String> = chunk.iter().map(|o| o.lb_name.clone()).collect();
            let balancers = match self
                .elb
                .describe_load_balancers()
                .set_names(Some(names))
                .send()
                .await
            {
                Ok(out) => out.load_balancers().to_vec(),
                // One unknown name fails the whole call: leave these Services out, the
                // framework updates them one by one (and recreates what is missing).
                Err(e) if code(&e) == Some("LoadBalancerNotFound") => continue,
                Err(e) => return Err(to_cloud_error("DescribeLoadBalancers", e)),
            };
            for owner in chunk {
                if let Some(lb) = balancers
                    .iter()
                    .find(|lb| lb.load_balancer_name() == Some(owner.lb_name.as_str()))
                {
                    found.push((owner.clone(), lb.clone()));
                }
            }
        }
        let instances = &instances;
        let answers = futures::stream::iter(found)
            .map(|(owner, lb)| async move {
                let lock = self.locks.get(&owner.lb_name);
                let _guard = lock.lock().await;
                (
                    owner.service.clone(),
                    self.update_hosts(&lb, instances).await,
                )
            })
            .buffer_unordered(UPDATE_CONCURRENCY)
            .collect()
            .await;
        Ok(answers)
    }
}
