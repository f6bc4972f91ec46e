/// Pod-CIDR routes in the route table of an Acme private network.
pub struct AcmeRoutes {
    api: acme_api::Client,
    network: String,
}

#[async_trait]
impl Routes for AcmeRoutes {
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        let routes = self.api.list_routes(&self.network).await.map_err(cloud_error)?;
        Ok(routes
            .into_iter()
            // Only this cluster's routes: the route controller deletes what it does not expect.
            .filter(|r| r.tags.get("kubernetes-cluster").map(String::as_str) == Some(cluster_name))
            .map(|r| Route {
                name: r.id,
                target_node: r.next_hop,
                destination_cidr: r.destination,
                blackhole: r.blackhole,
                ..Default::default()
            })
            .collect())
    }

    async fn create_route(
        &self,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        let tags = BTreeMap::from([
            ("kubernetes-cluster".to_owned(), cluster_name.to_owned()),
            ("kubernetes-node-uid".to_owned(), name_hint.to_owned()),
        ]);
        let created = self
            .api
            .create_route(&self.network, &route.destination_cidr, &route.target_node, tags)
            .await;
        match created {
            // After a restart the controller may create a route that exists: that is success.
            Ok(_) | Err(ApiError::AlreadyExists) => Ok(()),
            Err(e) => Err(cloud_error(e)),
        }
    }

    async fn delete_route(&self, _cluster_name: &str, route: &Route) -> CloudResult<()> {
        match self.api.delete_route(&self.network, &route.name).await {
            Ok(()) | Err(ApiError::NotFound) => Ok(()),
            Err(e) => Err(cloud_error(e)),
        }
    }
}
