//! `Routes` in one VPC route table (`routeTable` in the cloud config).
//!
//! A route sends a Node's pod CIDR (IPv4 or IPv6) to its instance. As in the AWS cloud
//! provider, the route's target Node is the instance's private DNS name, and a Node is found
//! by that name. The table is shared with other routes (the VPC's `local` route, gateways,
//! other clusters): the routes listed as this cluster's are those whose target instance
//! carries the cluster tag `kubernetes.io/cluster/<cluster>`, plus blackhole routes to an
//! instance that no longer exists (listed with `blackhole` set, as AWS does, so that the route
//! controller removes them when they fall in the cluster CIDR).

use aws_sdk_ec2::types::{Filter, Instance};
use ccm_core::{CloudError, CloudResult, Route, Routes, async_trait};
use tracing::info;

use crate::AwsCloud;
use crate::errors::{code, to_cloud_error};
use crate::load_balancer::cluster_tag_key;

impl AwsCloud {
    fn route_table(&self) -> CloudResult<&str> {
        self.config
            .route_table
            .as_deref()
            .ok_or_else(|| CloudError::msg("the cloud config names no `routeTable`"))
    }

    async fn table_routes(&self) -> CloudResult<Vec<aws_sdk_ec2::types::Route>> {
        let table = self.route_table()?;
        let out = self
            .clients
            .ec2
            .describe_route_tables()
            .route_table_ids(table)
            .send()
            .await
            .map_err(|e| to_cloud_error("DescribeRouteTables", e))?;
        Ok(out
            .route_tables()
            .iter()
            .flat_map(|t| t.routes().iter().cloned())
            .collect())
    }

    async fn instance_by_dns_name(&self, name: &str) -> CloudResult<Instance> {
        let out = self
            .clients
            .ec2
            .describe_instances()
            .filters(
                Filter::builder()
                    .name("private-dns-name")
                    .values(name)
                    .build(),
            )
            .send()
            .await
            .map_err(|e| to_cloud_error("DescribeInstances", e))?;
        out.reservations()
            .iter()
            .flat_map(|r| r.instances())
            .find(|i| i.state().and_then(|s| s.name()).map(|n| n.as_str()) != Some("terminated"))
            .cloned()
            .ok_or_else(|| {
                CloudError::msg(format!("no instance has the private DNS name {name:?}"))
            })
    }
}

fn destination(route: &aws_sdk_ec2::types::Route) -> Option<&str> {
    route
        .destination_cidr_block()
        .or(route.destination_ipv6_cidr_block())
}

#[async_trait]
impl Routes for AwsCloud {
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        self.count("list_routes");
        let routes: Vec<_> = self
            .table_routes()
            .await?
            .into_iter()
            .filter(|r| r.instance_id().is_some())
            .collect();
        if routes.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = routes
            .iter()
            .filter_map(|r| r.instance_id().map(str::to_owned))
            .collect();
        let out = self
            .clients
            .ec2
            .describe_instances()
            .filters(
                Filter::builder()
                    .name("instance-id")
                    .set_values(Some(ids))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| to_cloud_error("DescribeInstances", e))?;
        let instances: Vec<&Instance> = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .collect();
        let tag = cluster_tag_key(cluster_name);
        let mut listed = Vec::new();
        for route in &routes {
            let (Some(id), Some(cidr)) = (route.instance_id(), destination(route)) else {
                continue;
            };
            let instance = instances.iter().find(|i| i.instance_id() == Some(id));
            let blackhole = route.state().map(|s| s.as_str()) == Some("blackhole");
            match instance {
                Some(instance)
                    if instance
                        .tags()
                        .iter()
                        .any(|t| t.key() == Some(tag.as_str())) =>
                {
                    listed.push(Route {
                        name: format!("{}-{cidr}", id),
                        target_node: instance.private_dns_name().unwrap_or_default().to_owned(),
                        destination_cidr: cidr.to_owned(),
                        blackhole,
                        ..Default::default()
                    });
                }
                None if blackhole => listed.push(Route {
                    name: format!("{id}-{cidr}"),
                    destination_cidr: cidr.to_owned(),
                    blackhole: true,
                    ..Default::default()
                }),
                _ => {}
            }
        }
        Ok(listed)
    }

    async fn create_route(
        &self,
        _cluster_name: &str,
        _name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        self.count("create_route");
        let table = self.route_table()?.to_owned();
        let instance = self.instance_by_dns_name(&route.target_node).await?;
        let id = instance.instance_id().unwrap_or_default().to_owned();
        let cidr = route.destination_cidr.as_str();
        let ipv6 = cidr.contains(':');
        let existing = self
            .table_routes()
            .await?
            .into_iter()
            .find(|r| destination(r) == Some(cidr));
        match existing {
            Some(r)
                if r.instance_id() == Some(id.as_str())
                    && r.state().map(|s| s.as_str()) != Some("blackhole") =>
            {
                return Ok(());
            }
            Some(_) => {
                let mut replace = self
                    .clients
                    .ec2
                    .replace_route()
                    .route_table_id(&table)
                    .instance_id(&id);
                replace = if ipv6 {
                    replace.destination_ipv6_cidr_block(cidr)
                } else {
                    replace.destination_cidr_block(cidr)
                };
                replace
                    .send()
                    .await
                    .map_err(|e| to_cloud_error("ReplaceRoute", e))?;
            }
            None => {
                let mut create = self
                    .clients
                    .ec2
                    .create_route()
                    .route_table_id(&table)
                    .instance_id(&id);
                create = if ipv6 {
                    create.destination_ipv6_cidr_block(cidr)
                } else {
                    create.destination_cidr_block(cidr)
                };
                match create.send().await {
                    Ok(_) => {}
                    // Created meanwhile by a concurrent call for the same route.
                    Err(e) if code(&e) == Some("RouteAlreadyExists") => {}
                    Err(e) => return Err(to_cloud_error("CreateRoute", e)),
                }
            }
        }
        info!(route_table = %table, %cidr, instance = %id, node = %route.target_node, "created route");
        Ok(())
    }

    async fn delete_route(&self, _cluster_name: &str, route: &Route) -> CloudResult<()> {
        self.count("delete_route");
        let table = self.route_table()?;
        let cidr = route.destination_cidr.as_str();
        let mut delete = self.clients.ec2.delete_route().route_table_id(table);
        delete = if cidr.contains(':') {
            delete.destination_ipv6_cidr_block(cidr)
        } else {
            delete.destination_cidr_block(cidr)
        };
        match delete.send().await {
            Ok(_) => {
                info!(route_table = %table, %cidr, "deleted route");
                Ok(())
            }
            Err(e) if code(&e) == Some("InvalidRoute.NotFound") => Ok(()),
            Err(e) => Err(to_cloud_error("DeleteRoute", e)),
        }
    }
}
