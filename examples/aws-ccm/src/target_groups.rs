//! Target groups of the network load balancers: names, creation, targets and the tag scan.
//!
//! One target group per Service port, of type `instance`, on the port's NodePort, tagged with
//! the cluster, the Service and the load balancer's name. Its name encodes the port and
//! NodePort (a changed NodePort gets a new target group, the listener is switched to it and
//! the old one deleted), as the AWS cloud provider does.

use std::collections::BTreeSet;

use aws_sdk_elasticloadbalancingv2::types::{
    ProtocolEnum, Tag, TagDescription, TargetDescription, TargetGroup, TargetTypeEnum,
};
use ccm_core::{CloudError, CloudResult};
use sha2::{Digest, Sha256};
use tracing::info;

use crate::errors::{code, to_cloud_error};
use crate::load_balancer::{LB_NAME_TAG, NetworkLoadBalancers, Owner};

/// The most ARNs one `DescribeTags` call accepts.
const TAGS_PER_CALL: usize = 20;
/// The most target groups one `DescribeTargetGroups` page holds.
const TARGET_GROUP_PAGE: i32 = 400;

/// What one Service port asks of the load balancer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PortSpec {
    pub(crate) port: i32,
    pub(crate) node_port: i32,
    pub(crate) protocol: String,
}

impl PortSpec {
    pub(crate) fn protocol_enum(&self) -> ProtocolEnum {
        ProtocolEnum::from(self.protocol.as_str())
    }
}

/// `k8s-<namespace>-<name>-<hash>`, within the 32 characters ELBv2 allows, letters, digits and
/// hyphens only; the hash covers everything that makes the target group what it is.
pub(crate) fn target_group_name(owner: &Owner, spec: &PortSpec) -> String {
    let mut hasher = Sha256::new();
    for part in [
        owner.cluster.as_str(),
        owner.lb_name.as_str(),
        &spec.port.to_string(),
        &spec.node_port.to_string(),
        &spec.protocol,
    ] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let hash: String = hasher
        .finalize()
        .iter()
        .take(5)
        .map(|b| format!("{b:02x}"))
        .collect();
    let short = |s: &str| -> String {
        s.chars()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect()
    };
    let (namespace, name) = owner
        .service
        .split_once('/')
        .unwrap_or(("", &owner.service));
    format!("k8s-{}-{}-{hash}", short(namespace), short(name))
}

impl NetworkLoadBalancers {
    /// The target group for `spec`: the existing one of that name, else a new one.
    pub(crate) async fn ensure_target_group(
        &self,
        owner: &Owner,
        spec: &PortSpec,
    ) -> CloudResult<TargetGroup> {
        let name = target_group_name(owner, spec);
        match self.elb.describe_target_groups().names(&name).send().await {
            Ok(out) => {
                if let Some(group) = out.target_groups().first() {
                    return Ok(group.clone());
                }
            }
            Err(e) if code(&e) == Some("TargetGroupNotFound") => {}
            Err(e) => return Err(to_cloud_error("DescribeTargetGroups", e)),
        }
        let out = self
            .elb
            .create_target_group()
            .name(&name)
            .protocol(spec.protocol_enum())
            .port(spec.node_port)
            .vpc_id(&self.vpc)
            .target_type(TargetTypeEnum::Instance)
            .set_tags(Some(owner.tags()))
            .send()
            .await
            .map_err(|e| to_cloud_error("CreateTargetGroup", e))?;
        info!(target_group = %name, service = %owner.service, "created target group");
        out.target_groups().first().cloned().ok_or_else(|| {
            CloudError::msg(format!("CreateTargetGroup {name} answered no target group"))
        })
    }

    /// Registers the missing `instances` and deregisters the others (a diff, two calls at most).
    pub(crate) async fn reconcile_targets(
        &self,
        group_arn: &str,
        instances: &BTreeSet<String>,
    ) -> CloudResult<()> {
        let current = target_instances(&self.elb, group_arn).await?;
        let add: Vec<TargetDescription> = targets(instances.difference(&current));
        let remove: Vec<TargetDescription> = targets(current.difference(instances));
        if !add.is_empty() {
            self.elb
                .register_targets()
                .target_group_arn(group_arn)
                .set_targets(Some(add))
                .send()
                .await
                .map_err(|e| to_cloud_error("RegisterTargets", e))?;
        }
        if !remove.is_empty() {
            self.elb
                .deregister_targets()
                .target_group_arn(group_arn)
                .set_targets(Some(remove))
                .send()
                .await
                .map_err(|e| to_cloud_error("DeregisterTargets", e))?;
        }
        Ok(())
    }

    /// Every target group of the region carrying the cluster tag and, when `lb_name` is given,
    /// the load-balancer-name tag `lb_name`: ownership by tag, whatever listeners point to.
    pub(crate) async fn owned_target_groups(
        &self,
        cluster: &str,
        lb_name: Option<&str>,
    ) -> CloudResult<Vec<String>> {
        let mut pages = self
            .elb
            .describe_target_groups()
            .page_size(TARGET_GROUP_PAGE)
            .into_paginator()
            .send();
        let mut arns = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| to_cloud_error("DescribeTargetGroups", e))?;
            arns.extend(
                page.target_groups()
                    .iter()
                    .filter_map(|g| g.target_group_arn().map(str::to_owned)),
            );
        }
        let cluster_key = crate::load_balancer::cluster_tag_key(cluster);
        let mut owned = Vec::new();
        for chunk in arns.chunks(TAGS_PER_CALL) {
            for description in self.tags_of_groups(chunk).await? {
                let has = |key: &str, value: Option<&str>| {
                    description
                        .tags()
                        .iter()
                        .any(|t| t.key() == Some(key) && value.is_none_or(|v| t.value() == Some(v)))
                };
                if has(&cluster_key, None) && lb_name.is_none_or(|lb| has(LB_NAME_TAG, Some(lb))) {
                    owned.extend(description.resource_arn().map(str::to_owned));
                }
            }
        }
        Ok(owned)
    }

    /// The tags of up to 20 target groups in one `DescribeTags`.
    ///
    /// What the real API taught: one ARN deleted since the list (another Service's target
    /// group, deleted by another worker) fails the whole call with `TargetGroupNotFound`.
    /// Skipping the chunk would skip this Service's own target groups in it, which then leak;
    /// the chunk is asked again one ARN at a time instead.
    async fn tags_of_groups(&self, arns: &[String]) -> CloudResult<Vec<TagDescription>> {
        let reply = self
            .elb
            .describe_tags()
            .set_resource_arns(Some(arns.to_vec()))
            .send()
            .await;
        match reply {
            Ok(out) => Ok(out.tag_descriptions().to_vec()),
            Err(e) if code(&e) == Some("TargetGroupNotFound") && arns.len() > 1 => {
                let mut descriptions = Vec::new();
                for arn in arns {
                    descriptions
                        .extend(Box::pin(self.tags_of_groups(std::slice::from_ref(arn))).await?);
                }
                Ok(descriptions)
            }
            // Deleted since the list: nothing to find.
            Err(e) if code(&e) == Some("TargetGroupNotFound") => Ok(Vec::new()),
            Err(e) => Err(to_cloud_error("DescribeTags", e)),
        }
    }

    /// Deletes a target group; one already gone is fine. In use (a listener not yet gone)
    /// answers `CloudError::Retry`.
    pub(crate) async fn delete_target_group(&self, arn: &str) -> CloudResult<()> {
        match self
            .elb
            .delete_target_group()
            .target_group_arn(arn)
            .send()
            .await
        {
            Ok(_) => {
                info!(target_group = %arn, "deleted target group");
                Ok(())
            }
            Err(e) if code(&e) == Some("TargetGroupNotFound") => Ok(()),
            Err(e) if code(&e) == Some("ResourceInUse") => Err(CloudError::retry(
                std::time::Duration::from_secs(5),
                format!("target group {arn} is still in use by a listener"),
            )),
            Err(e) => Err(to_cloud_error("DeleteTargetGroup", e)),
        }
    }
}

/// The instance IDs registered in a target group (also for tests and probes).
pub async fn target_instances(
    elb: &aws_sdk_elasticloadbalancingv2::Client,
    group_arn: &str,
) -> CloudResult<BTreeSet<String>> {
    let health = elb
        .describe_target_health()
        .target_group_arn(group_arn)
        .send()
        .await
        .map_err(|e| to_cloud_error("DescribeTargetHealth", e))?;
    Ok(health
        .target_health_descriptions()
        .iter()
        .filter_map(|d| d.target()?.id().map(str::to_owned))
        .collect())
}

fn targets<'a>(ids: impl Iterator<Item = &'a String>) -> Vec<TargetDescription> {
    ids.map(|id| TargetDescription::builder().id(id).build())
        .collect()
}

/// Builds an ELBv2 tag.
pub(crate) fn tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).build()
}
