//! `InstancesV2` and `InstancesBatch` on EC2 `DescribeInstances`.
//!
//! A Node is identified by its provider ID `aws:///<az>/<instance-id>` when set, else by its
//! name, which must then be the instance's private DNS name (as in the AWS cloud provider).
//! States: `terminated` is gone (`instance_exists` false, the Node is deleted); `stopped` and
//! `stopping` are shut down (the Node is tainted); `shutting-down` (on its way to terminated)
//! counts as shut down too; `pending` and `running` are running.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::{Filter, Instance, InstanceStateName};
use ccm_core::{
    CloudError, CloudResult, InstanceAnswer, InstanceAnswers, InstanceMetadata, InstancesBatch,
    InstancesV2, NodeAddress, NodeView, async_trait,
};

use crate::AwsCloud;
use crate::errors::{code, to_cloud_error};

/// The most Nodes one batch asks about: the most values AWS accepts in one filter.
pub const MAX_BATCH: usize = 200;
/// The page size of filtered `DescribeInstances` calls (AWS allows 5 to 1,000).
pub const PAGE_SIZE: i32 = 1000;

/// The instance ID in a provider ID: `aws:///us-east-1a/i-0abc`, `aws:////i-0abc`,
/// `aws://i-0abc` or a bare `i-0abc`. `None` for anything else.
pub fn instance_id_from_provider_id(provider_id: &str) -> Option<&str> {
    let rest = match provider_id.strip_prefix("aws://") {
        Some(rest) => rest,
        None if !provider_id.contains("://") => provider_id,
        None => return None,
    };
    let id = rest.rsplit('/').next()?;
    let valid =
        id.len() > 2 && id.starts_with("i-") && id[2..].chars().all(|c| c.is_ascii_alphanumeric());
    valid.then_some(id)
}

/// How a Node is looked up: by instance ID (provider ID) or by private DNS name (its name).
enum Key<'a> {
    Id(&'a str),
    DnsName(&'a str),
}

fn key(node: &NodeView) -> CloudResult<Key<'_>> {
    match node.provider_id() {
        id if !id.is_empty() => instance_id_from_provider_id(id)
            .map(Key::Id)
            .ok_or_else(|| {
                CloudError::msg(format!(
                    "provider ID {id:?} is not an AWS instance ID (aws:///<zone>/i-...)"
                ))
            }),
        _ => match node.name() {
            "" => Err(CloudError::msg(
                "the Node has neither a provider ID nor a name",
            )),
            name => Ok(Key::DnsName(name)),
        },
    }
}

/// The lifecycle state of an instance, as the contract sees it.
#[derive(Debug, PartialEq, Eq)]
enum State {
    Running,
    Shutdown,
    Gone,
}

fn state(instance: &Instance) -> State {
    match instance.state().and_then(|s| s.name()) {
        Some(InstanceStateName::Terminated) => State::Gone,
        Some(
            InstanceStateName::Stopped
            | InstanceStateName::Stopping
            | InstanceStateName::ShuttingDown,
        ) => State::Shutdown,
        _ => State::Running,
    }
}

/// Among instances sharing a private DNS name (a terminated one and its replacement), the live
/// one.
fn pick(instances: Vec<Instance>) -> Option<Instance> {
    let mut instances = instances;
    instances.sort_by_key(|i| state(i) == State::Gone);
    instances.into_iter().next()
}

impl AwsCloud {
    /// The instance of `node`; `None` when AWS says it does not exist (an unknown ID, or no
    /// instance with the Node's name as private DNS name).
    async fn find_instance(&self, node: &NodeView) -> CloudResult<Option<Instance>> {
        match key(node)? {
            Key::Id(id) => {
                let reply = self
                    .clients
                    .ec2
                    .describe_instances()
                    .instance_ids(id)
                    .send()
                    .await;
                match reply {
                    Ok(out) => Ok(pick(flatten(out.reservations()))),
                    Err(e) if code(&e) == Some("InvalidInstanceID.NotFound") => Ok(None),
                    Err(e) => Err(to_cloud_error("DescribeInstances", e)),
                }
            }
            Key::DnsName(name) => {
                let found = self
                    .describe_filtered("private-dns-name", vec![name.to_owned()])
                    .await?;
                Ok(pick(found))
            }
        }
    }

    /// Every instance matching `filter` (any of `values`), following `NextToken`.
    async fn describe_filtered(
        &self,
        filter: &str,
        values: Vec<String>,
    ) -> CloudResult<Vec<Instance>> {
        let mut pages = self
            .clients
            .ec2
            .describe_instances()
            .filters(
                Filter::builder()
                    .name(filter)
                    .set_values(Some(values))
                    .build(),
            )
            .max_results(self.page_size)
            .into_paginator()
            .send();
        let mut instances = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| to_cloud_error("DescribeInstances", e))?;
            instances.extend(flatten(page.reservations()));
        }
        Ok(instances)
    }

    /// The metadata of a live instance.
    pub(crate) fn metadata(&self, instance: &Instance) -> InstanceMetadata {
        let zone = instance
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default()
            .to_owned();
        let id = instance.instance_id().unwrap_or_default();
        let mut addresses = Vec::new();
        let mut push = |type_: &str, address: Option<&str>| {
            if let Some(address) = address.filter(|a| !a.is_empty()) {
                let address = NodeAddress {
                    type_: type_.to_owned(),
                    address: address.to_owned(),
                };
                if !addresses.contains(&address) {
                    addresses.push(address);
                }
            }
        };
        push("InternalIP", instance.private_ip_address());
        push("ExternalIP", instance.public_ip_address());
        push("InternalDNS", instance.private_dns_name());
        push("Hostname", instance.private_dns_name());
        push("ExternalDNS", instance.public_dns_name());
        InstanceMetadata {
            provider_id: format!("aws:///{zone}/{id}"),
            instance_type: instance
                .instance_type()
                .map(|t| t.as_str().to_owned())
                .unwrap_or_default(),
            node_addresses: addresses,
            zone,
            region: self.config.region.clone(),
            additional_labels: BTreeMap::new(),
        }
    }

    fn answer(&self, instance: &Instance) -> InstanceAnswer {
        match state(instance) {
            State::Gone => InstanceAnswer::NotFound,
            State::Shutdown => InstanceAnswer::Shutdown(self.metadata(instance)),
            State::Running => InstanceAnswer::Found(self.metadata(instance)),
        }
    }
}

fn flatten(reservations: &[aws_sdk_ec2::types::Reservation]) -> Vec<Instance> {
    reservations
        .iter()
        .flat_map(|r| r.instances().iter().cloned())
        .collect()
}

#[async_trait]
impl InstancesV2 for AwsCloud {
    async fn instance_exists(&self, node: &NodeView) -> CloudResult<bool> {
        self.count("instance_exists");
        Ok(self
            .find_instance(node)
            .await?
            .is_some_and(|i| state(&i) != State::Gone))
    }

    async fn instance_shutdown(&self, node: &NodeView) -> CloudResult<bool> {
        self.count("instance_shutdown");
        Ok(self
            .find_instance(node)
            .await?
            .is_some_and(|i| state(&i) == State::Shutdown))
    }

    async fn instance_metadata(&self, node: &NodeView) -> CloudResult<InstanceMetadata> {
        self.count("instance_metadata");
        match self.find_instance(node).await? {
            Some(instance) if state(&instance) != State::Gone => Ok(self.metadata(&instance)),
            _ => Err(CloudError::InstanceNotFound),
        }
    }
}

/// One filtered `DescribeInstances` for the Nodes with a provider ID (filter `instance-id`)
/// and one for those without (filter `private-dns-name`), each following `NextToken`.
///
/// What the real API taught: a describe *by instance IDs* fails as a whole with
/// `InvalidInstanceID.NotFound` as soon as one ID is unknown, so a batch uses the `instance-id`
/// filter, which simply leaves unknown IDs out. Those Nodes are left out of the answer
/// (unknown, as the contract says), and the framework asks about them alone, where the
/// explicit `InvalidInstanceID.NotFound` answers "gone".
#[async_trait]
impl InstancesBatch for AwsCloud {
    fn max_batch_size(&self) -> usize {
        MAX_BATCH
    }

    async fn describe_instances(&self, nodes: &[NodeView]) -> CloudResult<InstanceAnswers> {
        self.count("describe_instances");
        let mut by_id: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut by_dns: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut answers = InstanceAnswers::new();
        for node in nodes {
            let name = node.name().to_owned();
            match key(node) {
                Ok(Key::Id(id)) => by_id.entry(id.to_owned()).or_default().push(name),
                Ok(Key::DnsName(dns)) => by_dns.entry(dns.to_owned()).or_default().push(name),
                Err(e) => {
                    answers.insert(name, InstanceAnswer::Error(e));
                }
            }
        }
        if !by_id.is_empty() {
            let found = self
                .describe_filtered("instance-id", by_id.keys().cloned().collect())
                .await?;
            for instance in found {
                let id = instance.instance_id().unwrap_or_default();
                for name in by_id.get(id).into_iter().flatten() {
                    answers.insert(name.clone(), self.answer(&instance));
                }
            }
        }
        if !by_dns.is_empty() {
            let found = self
                .describe_filtered("private-dns-name", by_dns.keys().cloned().collect())
                .await?;
            let mut grouped: BTreeMap<String, Vec<Instance>> = BTreeMap::new();
            for instance in found {
                let dns = instance.private_dns_name().unwrap_or_default().to_owned();
                grouped.entry(dns).or_default().push(instance);
            }
            for (dns, instances) in grouped {
                let Some(instance) = pick(instances) else {
                    continue;
                };
                for name in by_dns.get(&dns).into_iter().flatten() {
                    answers.insert(name.clone(), self.answer(&instance));
                }
            }
        }
        Ok(answers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids() {
        assert_eq!(
            instance_id_from_provider_id("aws:///us-east-1a/i-0abc"),
            Some("i-0abc")
        );
        assert_eq!(
            instance_id_from_provider_id("aws:////i-0abc"),
            Some("i-0abc")
        );
        assert_eq!(instance_id_from_provider_id("aws://i-0abc"), Some("i-0abc"));
        assert_eq!(instance_id_from_provider_id("i-0abc"), Some("i-0abc"));
        assert_eq!(instance_id_from_provider_id("gce://p/z/i-0abc"), None);
        assert_eq!(instance_id_from_provider_id("aws:///us-east-1a/vm-1"), None);
        assert_eq!(instance_id_from_provider_id("aws:///us-east-1a/i-"), None);
    }
}
