//! An AWS account in moto set up for one test: a VPC with a random /16 (so that private DNS
//! names, and with them Node names, are unique on a shared cluster), a subnet for the Nodes and
//! the load balancers of Services without a class, a second one for internal load balancers
//! (`internalSubnets`), the VPC's route table and instances tagged with the cluster tag, plus
//! the provider configured for it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use aws_ccm::{AwsCloud, AwsConfig};
use aws_credential_types::Credentials;
use aws_sdk_ec2::types::{Filter, Instance, InstanceType, ResourceType, Tag, TagSpecification};
use ccm_core::Node;

use super::moto::Moto;

pub const REGION: &str = "us-east-1";
pub const ZONE: &str = "us-east-1a";

/// One account: the moto server, the network and the provider.
pub struct World {
    pub moto: Moto,
    pub cluster: String,
    pub config: AwsConfig,
    pub cloud: Arc<AwsCloud>,
    pub ec2: aws_sdk_ec2::Client,
    pub elb: aws_sdk_elasticloadbalancingv2::Client,
}

/// A second octet for the VPC, distinct for the tests of one process and random across
/// processes (Node names derive from it, and must not collide on a shared cluster).
fn random_octet() -> u8 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_micros()
        .wrapping_add(std::process::id());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (seed.wrapping_mul(31).wrapping_add(n.wrapping_mul(47)) % 250) as u8 + 1
}

impl World {
    /// Starts moto and creates the network for `cluster`.
    pub async fn new(cluster: &str) -> World {
        Self::with_options(cluster, true, 1).await
    }

    /// As [`World::new`], with the batch capabilities on or off and the provisioning delay.
    pub async fn with_options(
        cluster: &str,
        batch: bool,
        provisioning_retry_seconds: u64,
    ) -> World {
        let moto = Moto::start();
        let bootstrap = AwsConfig::parse(
            format!(
                "region: {REGION}\nvpc: vpc-0\nendpointUrl: {}\n",
                moto.url()
            )
            .as_bytes(),
        )
        .unwrap();
        let clients = aws_ccm::Clients::new(&bootstrap, Some(credentials()));
        let ec2 = clients.ec2.clone();
        let octet = random_octet();
        let vpc = ec2
            .create_vpc()
            .cidr_block(format!("10.{octet}.0.0/16"))
            .send()
            .await
            .unwrap();
        let vpc = vpc.vpc().unwrap().vpc_id().unwrap().to_owned();
        let mut subnets = Vec::new();
        for cidr in [format!("10.{octet}.0.0/20"), format!("10.{octet}.16.0/20")] {
            let subnet = ec2
                .create_subnet()
                .vpc_id(&vpc)
                .cidr_block(cidr)
                .availability_zone(ZONE)
                .send()
                .await
                .unwrap();
            subnets.push(subnet.subnet().unwrap().subnet_id().unwrap().to_owned());
        }
        let (subnet, internal_subnet) = (&subnets[0], &subnets[1]);
        let tables = ec2
            .describe_route_tables()
            .filters(Filter::builder().name("vpc-id").values(&vpc).build())
            .send()
            .await
            .unwrap();
        let table = tables.route_tables()[0]
            .route_table_id()
            .unwrap()
            .to_owned();
        let text = format!(
            "region: {REGION}\nvpc: {vpc}\nsubnets: [{subnet}]\ninternalSubnets: [{internal_subnet}]\nrouteTable: {table}\nendpointUrl: {}\nprovisioningRetrySeconds: {provisioning_retry_seconds}\n",
            moto.url()
        );
        let config = AwsConfig::parse(text.as_bytes()).unwrap();
        let cloud = Arc::new(AwsCloud::new(config.clone(), Some(credentials())).with_batch(batch));
        // The test's own clients (not the provider's), so that the provider's request count
        // holds only what the provider sent.
        World {
            ec2,
            elb: clients.elb.clone(),
            moto,
            cluster: cluster.to_owned(),
            config,
            cloud,
        }
    }

    /// The cloud-config file's contents for this account.
    pub fn config_yaml(&self) -> String {
        let c = &self.config;
        format!(
            "region: {}\nvpc: {}\nsubnets: [{}]\ninternalSubnets: [{}]\nrouteTable: {}\nendpointUrl: {}\nprovisioningRetrySeconds: 1\n",
            c.region,
            c.vpc,
            c.subnets.join(", "),
            c.internal_load_balancer_subnets().join(", "),
            c.route_table.as_deref().unwrap_or_default(),
            self.moto.url()
        )
    }

    /// Launches `count` instances tagged with the cluster tag.
    pub async fn launch(&self, count: i32) -> Vec<Instance> {
        let tags = TagSpecification::builder()
            .resource_type(ResourceType::Instance)
            .tags(
                Tag::builder()
                    .key(format!("kubernetes.io/cluster/{}", self.cluster))
                    .value("owned")
                    .build(),
            )
            .build();
        let out = self
            .ec2
            .run_instances()
            .image_id("ami-12c6146b")
            .instance_type(InstanceType::T3Medium)
            .min_count(count)
            .max_count(count)
            .subnet_id(&self.config.subnets[0])
            .tag_specifications(tags)
            .send()
            .await
            .unwrap();
        out.instances().to_vec()
    }

    pub async fn stop(&self, id: &str) {
        self.ec2
            .stop_instances()
            .instance_ids(id)
            .send()
            .await
            .unwrap();
    }

    pub async fn terminate(&self, id: &str) {
        self.ec2
            .terminate_instances()
            .instance_ids(id)
            .send()
            .await
            .unwrap();
    }

    /// Everything in ELBv2 that carries this cluster's tag: load balancers, target groups and
    /// the listeners of those load balancers (by ARN).
    pub async fn tagged_elb_resources(&self) -> BTreeSet<String> {
        let key = format!("kubernetes.io/cluster/{}", self.cluster);
        let mut arns = Vec::new();
        let lbs = self.elb.describe_load_balancers().send().await.unwrap();
        arns.extend(
            lbs.load_balancers()
                .iter()
                .filter_map(|l| l.load_balancer_arn().map(str::to_owned)),
        );
        let groups = self.elb.describe_target_groups().send().await.unwrap();
        arns.extend(
            groups
                .target_groups()
                .iter()
                .filter_map(|g| g.target_group_arn().map(str::to_owned)),
        );
        let mut tagged = BTreeSet::new();
        for chunk in arns.chunks(20) {
            let tags = self
                .elb
                .describe_tags()
                .set_resource_arns(Some(chunk.to_vec()))
                .send()
                .await
                .unwrap();
            for d in tags.tag_descriptions() {
                if d.tags().iter().any(|t| t.key() == Some(key.as_str())) {
                    tagged.insert(d.resource_arn().unwrap().to_owned());
                }
            }
        }
        for lb in lbs.load_balancers() {
            let arn = lb.load_balancer_arn().unwrap();
            if tagged.contains(arn) {
                let listeners = self
                    .elb
                    .describe_listeners()
                    .load_balancer_arn(arn)
                    .send()
                    .await
                    .unwrap();
                tagged.extend(
                    listeners
                        .listeners()
                        .iter()
                        .filter_map(|l| l.listener_arn().map(str::to_owned)),
                );
            }
        }
        tagged
    }

    /// The load balancer called `lb_name` as ELBv2 describes it, if it exists.
    pub async fn load_balancer(
        &self,
        lb_name: &str,
    ) -> Option<aws_sdk_elasticloadbalancingv2::types::LoadBalancer> {
        let lbs = self
            .elb
            .describe_load_balancers()
            .names(lb_name)
            .send()
            .await
            .ok()?;
        lbs.load_balancers().first().cloned()
    }

    /// The scheme (`internet-facing`, `internal`) and the subnets of the load balancer
    /// `lb_name`, if it exists.
    pub async fn placement_of(&self, lb_name: &str) -> Option<(String, Vec<String>)> {
        let lb = self.load_balancer(lb_name).await?;
        let subnets = lb
            .availability_zones()
            .iter()
            .filter_map(|z| z.subnet_id().map(str::to_owned))
            .collect();
        Some((lb.scheme()?.as_str().to_owned(), subnets))
    }

    /// The instance IDs registered behind the load balancer `lb_name`, per listener port.
    pub async fn targets_of(&self, lb_name: &str) -> Option<Vec<(i32, BTreeSet<String>)>> {
        let arn = self
            .load_balancer(lb_name)
            .await?
            .load_balancer_arn()?
            .to_owned();
        let listeners = self
            .elb
            .describe_listeners()
            .load_balancer_arn(&arn)
            .send()
            .await
            .ok()?;
        let mut out = Vec::new();
        for listener in listeners.listeners() {
            let group = listener.default_actions().first()?.target_group_arn()?;
            out.push((
                listener.port()?,
                aws_ccm::target_groups::target_instances(&self.elb, group)
                    .await
                    .ok()?,
            ));
        }
        out.sort();
        Some(out)
    }

    /// The routes of the route table to an instance: (destination, instance ID).
    pub async fn instance_routes(&self) -> BTreeSet<(String, String)> {
        let table = self.config.route_table.clone().unwrap();
        let out = self
            .ec2
            .describe_route_tables()
            .route_table_ids(table)
            .send()
            .await
            .unwrap();
        out.route_tables()
            .iter()
            .flat_map(|t| t.routes())
            .filter_map(|r| {
                let cidr = r
                    .destination_cidr_block()
                    .or(r.destination_ipv6_cidr_block())?;
                Some((cidr.to_owned(), r.instance_id()?.to_owned()))
            })
            .collect()
    }
}

pub fn credentials() -> Credentials {
    Credentials::new("testing", "testing", None, None, "moto")
}

/// The IDs of `instances`.
pub fn instance_ids(instances: &[Instance]) -> impl Iterator<Item = String> + '_ {
    instances
        .iter()
        .map(|i| i.instance_id().unwrap().to_owned())
}

/// The provider ID the provider writes for `instance`.
pub fn provider_id(instance: &Instance) -> String {
    format!("aws:///{ZONE}/{}", instance.instance_id().unwrap())
}

/// A Node named after the instance's private DNS name (how AWS names Nodes).
pub fn node_named(instance: &Instance) -> Node {
    let mut node = Node::default();
    node.metadata.name = Some(instance.private_dns_name().unwrap().to_owned());
    node
}

/// A Node with the instance's provider ID.
pub fn node_with_id(instance: &Instance) -> Node {
    let mut node = node_named(instance);
    node.spec = Some(ccm_core::k8s_openapi::api::core::v1::NodeSpec {
        provider_id: Some(provider_id(instance)),
        ..Default::default()
    });
    node
}
