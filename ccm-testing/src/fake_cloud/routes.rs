//! The route table as a test reads and seeds it, and the state file's view of the cloud
//! (load balancers and routes).

use ccm_core::Route;

use super::{FakeCloud, FakeCloudState, RouteState, State, StoredLoadBalancer, StoredRoute};

impl FakeCloud {
    /// The route table, in route-name order, with `enable_node_addresses` as stored.
    ///
    /// In method-call syntax this inherent method shadows [`CloudProvider::routes`](ccm_core::CloudProvider::routes) (the
    /// capability); reach that one with `CloudProvider::routes(&cloud)` or
    /// `cloud.provider().routes()`.
    pub fn routes(&self) -> Vec<Route> {
        self.lock()
            .routes
            .values()
            .map(|r| r.route.clone())
            .collect()
    }

    /// Seeds a route, e.g. a stale or blackhole route the route controller should delete. It
    /// is listed for every cluster name. A route without a name is named
    /// `seed-<destination_cidr>`; a route with the name of an existing one replaces it.
    pub fn insert_route(&self, route: Route) {
        let mut route = route;
        if route.name.is_empty() {
            route.name = format!("seed-{}", route.destination_cidr);
        }
        let mut st = self.lock();
        st.routes.insert(
            route.name.clone(),
            StoredRoute {
                cluster: None,
                route,
            },
        );
        if let Err(e) = self.persist(&st) {
            tracing::error!(error = %e, "fake cloud: state file not written");
        }
    }

    /// The load balancers and routes, as the state file holds them (also without one).
    pub fn state(&self) -> FakeCloudState {
        self.lock().snapshot()
    }
}

impl State {
    /// The load balancers and routes, as the state file holds them.
    pub(super) fn snapshot(&self) -> FakeCloudState {
        FakeCloudState {
            load_balancers: self
                .load_balancers
                .iter()
                .map(|(key, lb)| (key.clone(), lb.to_state()))
                .collect(),
            routes: self
                .routes
                .values()
                .map(|r| RouteState {
                    name: r.route.name.clone(),
                    cluster_name: r.cluster.clone(),
                    target_node: r.route.target_node.clone(),
                    destination_cidr: r.route.destination_cidr.clone(),
                    target_node_addresses: r.route.target_node_addresses.clone(),
                    blackhole: r.route.blackhole,
                    enable_node_addresses: r.route.enable_node_addresses,
                })
                .collect(),
        }
    }

    /// Replaces the load balancers and routes with those of a state file.
    pub(super) fn restore(&mut self, saved: FakeCloudState) {
        for (key, lb) in saved.load_balancers {
            let names: Vec<&str> = lb.hosts.iter().map(String::as_str).collect();
            let hosts = self.host_sets.intern(&names);
            self.host_counts.replace(None, Some(&hosts));
            let replaced = self.load_balancers.insert(
                key,
                StoredLoadBalancer {
                    name: lb.name,
                    class: lb.class,
                    hosts,
                    ports: lb.ports,
                    cluster_name: lb.cluster_name,
                    ingress_ip: lb.ingress_ip.and_then(|ip| ip.parse().ok()),
                },
            );
            if let Some(replaced) = replaced {
                self.host_counts.replace(Some(&replaced.hosts), None);
            }
        }
        for r in saved.routes {
            self.routes.insert(
                r.name.clone(),
                StoredRoute {
                    cluster: r.cluster_name,
                    route: Route {
                        name: r.name,
                        target_node: r.target_node,
                        enable_node_addresses: r.enable_node_addresses,
                        target_node_addresses: r.target_node_addresses,
                        destination_cidr: r.destination_cidr,
                        blackhole: r.blackhole,
                    },
                },
            );
        }
    }
}
